"""The update rules (onnxtrain.update_rules), one row per registered rule,
against an oracle: scikit-learn's ``_stochastic_optimizers`` (SGD, momentum,
Nesterov, Adam) and PyTorch's AdamW; and the two optimizer APIs adapting
them (learning-rate objects, onnxblock blocks) emit the rule's nodes."""
import numpy as np
import onnxruntime
import pytest
from numpy.testing import assert_allclose
from onnx import TensorProto
from sklearn.neural_network._stochastic_optimizers import (AdamOptimizer,
                                                           SGDOptimizer)

from onnxtrain._small import finish, new_builder, tensor_input
from onnxtrain.optim import (LearningRateAdam, LearningRateAdamW,
                             LearningRateSGD, LearningRateSGDNesterov)
from onnxtrain.update_rules import (AdamRule, AdamWRule, MomentumRule, SGDRule,
                                    get_update_rule, register_update_rule,
                                    registered_update_rules)

SHAPES = [(3, 2), (2,)]
RATES = [0.1, 0.05, 0.2, 0.01, 0.07]


def _rule_session(rule, dtype=TensorProto.DOUBLE):
    """A graph running ``rule`` on two parameters: inputs learning_rate,
    step, then p, g and the states of each; outputs the new values."""
    g = new_builder(17)
    inputs = [tensor_input("learning_rate", dtype, []), tensor_input("step", dtype, [])]
    outputs = []
    scalars = {"learning_rate": "learning_rate", "step": "step"}
    for i, shape in enumerate(SHAPES):
        names = [f"p{i}", f"g{i}"] + [f"p{i}_{s}" for s in rule.state_names]
        news = [f"p{i}_new"] + [f"p{i}_{s}_new" for s in rule.state_names]
        for n in names + news:
            g.reserve(n)
        inputs += [tensor_input(n, dtype, shape) for n in names]
        outputs += [tensor_input(n, dtype, shape) for n in news]
        rule.update(g, dtype, names[0], names[1], names[2:], scalars, news)
    model = finish(g, "rule", inputs, outputs)
    return onnxruntime.InferenceSession(model.SerializeToString(),
                                        providers=["CPUExecutionProvider"])


def _run_rule(rule, params, grads_seq):
    sess = _rule_session(rule)
    params = [p.copy() for p in params]
    states = [rule.init(p.shape, p.dtype) for p in params]
    width = 1 + len(rule.state_names)
    for step, (lr, grads) in enumerate(zip(RATES, grads_seq), start=1):
        feeds = {"learning_rate": np.array(lr), "step": np.array(float(step))}
        for i, (p, gr, st) in enumerate(zip(params, grads, states)):
            feeds[f"p{i}"], feeds[f"g{i}"] = p, gr
            feeds.update({f"p{i}_{s}": v for s, v in zip(rule.state_names, st)})
        out = sess.run(None, feeds)
        params = out[::width]
        states = [out[i * width + 1:(i + 1) * width] for i in range(len(SHAPES))]
    return params


def _sklearn_sgd(momentum, nesterov):
    def oracle(params, grads_seq):
        params = [p.copy() for p in params]
        opt = SGDOptimizer(params, RATES[0], momentum=momentum, nesterov=nesterov)
        for lr, grads in zip(RATES, grads_seq):
            opt.learning_rate = lr
            opt.update_params(params, grads)
        return params
    return oracle


def _sklearn_adam(beta_1, beta_2, epsilon):
    def oracle(params, grads_seq):
        params = [p.copy() for p in params]
        opt = AdamOptimizer(params, RATES[0], beta_1, beta_2, epsilon)
        for lr, grads in zip(RATES, grads_seq):
            opt.learning_rate_init = lr
            opt.update_params(params, grads)
        return params
    return oracle


def _torch_adamw(beta_1, beta_2, weight_decay):
    """torch.optim.AdamW with eps=0: PyTorch divides sqrt(v) by the second
    bias correction before adding eps, scikit-learn (and the rule) does not;
    without eps both are the same formula."""
    torch = pytest.importorskip("torch")

    def oracle(params, grads_seq):
        tensors = [torch.tensor(p, dtype=torch.float64, requires_grad=True)
                   for p in params]
        opt = torch.optim.AdamW(tensors, lr=RATES[0], betas=(beta_1, beta_2),
                                eps=0.0, weight_decay=weight_decay)
        for lr, grads in zip(RATES, grads_seq):
            for group in opt.param_groups:
                group["lr"] = lr
            for t, grad in zip(tensors, grads):
                t.grad = torch.tensor(grad)
            opt.step()
        return [t.detach().numpy() for t in tensors]
    return oracle


ROWS = [
    ("sgd", SGDRule(), _sklearn_sgd(0.0, False)),
    ("momentum", MomentumRule(0.8, nesterov=False), _sklearn_sgd(0.8, False)),
    ("momentum-nesterov", MomentumRule(0.9, nesterov=True), _sklearn_sgd(0.9, True)),
    ("adam", AdamRule(0.8, 0.99, 1e-7), _sklearn_adam(0.8, 0.99, 1e-7)),
    ("adamw", AdamWRule(0.85, 0.98, 0.0, weight_decay=0.1),
     _torch_adamw(0.85, 0.98, 0.1)),
]


def test_every_registered_rule_has_a_row():
    assert {row[1].rule_name for row in ROWS} == set(registered_update_rules())


@pytest.mark.parametrize("name,rule,oracle", ROWS, ids=[r[0] for r in ROWS])
def test_rule_matches_its_oracle(name, rule, oracle):
    rng = np.random.RandomState(3)
    params = [rng.randn(*s) for s in SHAPES]
    grads_seq = [[rng.randn(*s) for s in SHAPES] for _ in RATES]
    got = _run_rule(rule, params, grads_seq)
    for a, b in zip(got, oracle(params, grads_seq)):
        assert_allclose(a, b, rtol=1e-10, atol=1e-12)


def test_registry_refuses_duplicates_and_names_unknown_rules():
    with pytest.raises(ValueError, match="'sgd' is registered already"):
        register_update_rule("sgd")(SGDRule)
    with pytest.raises(ValueError, match="Unknown update rule 'rmsprop'.*'adam'"):
        get_update_rule("rmsprop")
    assert get_update_rule("adamw", weight_decay=0.5) == AdamWRule(weight_decay=0.5)


def test_names_in_any_case():
    """'Adam' and 'adam' (scikit-learn's spelling) name the same rule, for
    the update rules and the estimators' learning rates, losses and
    penalties; an unknown name still lists the accepted ones."""
    from onnxtrain.losses import SquareLearningLoss, resolve_learning_loss
    from onnxtrain.optim import (LearningRateAdam, LearningRateAdamW,
                                 LearningRateSGD, resolve_learning_rate)
    assert get_update_rule("AdamW", weight_decay=0.5) == AdamWRule(weight_decay=0.5)
    assert type(resolve_learning_rate("adam")) is LearningRateAdam
    assert type(resolve_learning_rate("ADAMW")) is LearningRateAdamW
    assert type(resolve_learning_rate("sgd")) is LearningRateSGD
    assert type(resolve_learning_loss("Square_Error")) is SquareLearningLoss
    with pytest.raises(ValueError, match=r"Unknown learning_rate 'adamx'.*'Adam'"):
        resolve_learning_rate("adamx")


@pytest.mark.parametrize("rate,rule", [
    (LearningRateSGD(0.1), SGDRule()),
    (LearningRateSGDNesterov(0.1, momentum=0.7, nesterov=False),
     MomentumRule(0.7, False)),
    (LearningRateSGDNesterov(0.1), MomentumRule(0.9, True)),
    (LearningRateAdam(0.1, beta_1=0.8), AdamRule(beta_1=0.8)),
    (LearningRateAdamW(0.1, weight_decay=0.2), AdamRule(weight_decay=0.2)),
])
def test_learning_rates_adapt_the_rules(rate, rule):
    """A learning-rate object is a schedule plus one of the rules: its
    update graph holds the rule's nodes (same op types, in order)."""
    assert rate.update_rule() == rule
    model = rate.build_onnx([("W", (2, 2))], TensorProto.DOUBLE, 17)
    g = new_builder(17)
    scalars = {"learning_rate": "learning_rate", "step": "step"}
    if getattr(rate, "weight_decay", 0):
        scalars["decay"] = "decay"
    for n in ["W", "W_grad"] + [f"W_{s}" for s in rate.state_names]:
        g.reserve(n)
    rule.update(g, TensorProto.DOUBLE, "W", "W_grad",
                [f"W_{s}" for s in rate.state_names], scalars)
    emitted = [n.op_type for n in g.nodes]
    assert [n.op_type for n in model.graph.node][:len(emitted)] == emitted


def test_onnxblock_blocks_adapt_the_rules():
    from onnxtrain.onnxblock.optim import SGD, AdamW
    assert SGD().update_rule() == SGDRule()
    block = AdamW(bias_correction=False, betas=(0.8, 0.95), eps=1e-7,
                  weight_decay=0.1)
    assert block.update_rule() == AdamRule(0.8, 0.95, 1e-7, 0.1, False)


def test_learning_rate_of_the_former_api_still_builds():
    """A subclass written for the former extension point (``_update``)
    keeps emitting its own update."""
    class HalfStep(LearningRateSGD):
        def _update(self, g, weight, grad, states, new_weight, new_states):
            step = g.op("Mul", grad, "learning_rate")
            g.op("Sub", weight, g.op("Mul", step, g.const(0.5, g.elem_type(weight))),
                 outputs=[new_weight])

    rate = HalfStep(0.2, learning_rate="constant").init_learning_rate()
    model = rate.build_onnx([("W", (2,))], TensorProto.DOUBLE, 17)
    sess = onnxruntime.InferenceSession(model.SerializeToString(),
                                        providers=["CPUExecutionProvider"])
    feeds = {k: np.array(v) for k, v in rate.step_scalars(1).items()}
    feeds.update(loss=np.array(0.0), penalty_scale=np.array(1.0),
                 W=np.array([1.0, 2.0]), W_grad=np.array([1.0, -1.0]))
    assert_allclose(sess.run(None, feeds)[0], [0.9, 2.1])
