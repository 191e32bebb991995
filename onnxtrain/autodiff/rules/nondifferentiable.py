"""Ops whose outputs carry no gradient (integer-valued, piecewise constant,
or random)."""
from ..registry import register_nondifferentiable

register_nondifferentiable(
    "Shape", "Size", "ArgMax", "ArgMin", "Equal", "Less", "Greater",
    "LessOrEqual", "GreaterOrEqual", "Not", "And", "Or", "Xor", "IsNaN",
    "IsInf", "Sign", "Hardmax", "Floor", "Ceil", "Round", "NonZero", "ConstantOfShape",
    "Constant", "EyeLike", "Range", "OneHot", "RandomNormal", "RandomUniform",
    "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli",
    "BitShift", "BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitwiseNot")

register_nondifferentiable(
    "ZipMap", "LabelEncoder", "CastMap",
    "CategoryMapper", "DictVectorizer", "OneHotEncoder", "Binarizer",
    "TreeEnsembleClassifier", "TreeEnsembleRegressor", "TreeEnsemble",
    domain="ai.onnx.ml")
