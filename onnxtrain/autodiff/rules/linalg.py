"""VJP rules of MatMul (numpy matmul semantics), Gemm, Einsum and Det."""
import numpy as np
from onnx import TensorProto, helper

from ..registry import register_vjp


def _transpose_last_two(g, x, rank):
    """Swap the last two axes of a tensor of static ``rank``
    (:meth:`~onnxtrain.graph.GraphBuilder.transpose`)."""
    perm = list(range(rank))
    perm[-2], perm[-1] = perm[-1], perm[-2]
    return g.transpose(x, perm)


def _reduce_to_operand(ctx, grad, batch, operand, promoted_shape):
    """Reduce ``grad`` (shape ``batch + promoted_shape[-2:]``) to ``operand``."""
    if ctx.rank(operand) >= 2:
        return ctx.sum_to(grad, batch + promoted_shape[-2:], operand)
    if batch:  # a 1-D operand has no batch axes: sum every one of them
        grad = ctx.g.reduce_sum(grad, list(range(len(batch))), keepdims=0)
    return ctx.g.reshape_like(grad, operand)


@register_vjp("MatMul")
def _matmul(ctx, gy):
    # Y = A @ B (numpy.matmul): dA = dY @ B^T, dB = A^T @ dY, with 1-D
    # operands promoted to (1, k) on the left and (k, 1) on the right.
    a, b = ctx.inputs
    ra, rb = ctx.rank(a, "MatMul"), ctx.rank(b, "MatMul")
    if ra == 1 and rb == 1:  # dot product: gy is a scalar
        return (ctx.op("Mul", gy, b) if ctx.needs_grad[0] else None,
                ctx.op("Mul", gy, a) if ctx.needs_grad[1] else None)
    sa, sb = ctx.shape(a), ctx.shape(b)
    a2, sa2, b2, sb2, g2 = a, sa, b, sb, gy
    if ra == 1:
        a2, sa2 = ctx.g.unsqueeze(a, [0]), (1,) + sa
        g2 = ctx.g.unsqueeze(gy, [rb - 2])
    if rb == 1:
        b2, sb2 = ctx.g.unsqueeze(b, [1]), sb + (1,)
        g2 = ctx.g.unsqueeze(gy, [ra - 1])
    batch = _broadcast_batch(sa2[:-2], sb2[:-2])
    ga = gb = None
    if ctx.needs_grad[0]:
        grad = ctx.op("MatMul", g2, _transpose_last_two(ctx.g, b2, len(sb2)))
        ga = _reduce_to_operand(ctx, grad, batch, a, sa2)
    if ctx.needs_grad[1]:
        gb = _weight_grad_2d(ctx, a, gy, ra, rb, sb)
        if gb is None:
            grad = ctx.op("MatMul", _transpose_last_two(ctx.g, a2, len(sa2)), g2)
            gb = _reduce_to_operand(ctx, grad, batch, b, sb2)
    return ga, gb


def _weight_grad_2d(ctx, a, gy, ra, rb, sb):
    """dB of a batched A (rank >= 3) times a 2-D B (a linear layer on a
    sequence): every batch row is a row of one product, so dB = A2^T dY2
    with A and dY flattened to 2-D: one GEMM whose inner dimension is the
    whole batch, instead of a product per batch entry summed afterwards
    (a temporary batch times the size of B). None when it does not apply
    (B's static shape is needed for the reshapes)."""
    if rb != 2 or ra < 3 or sb is None or \
            not all(isinstance(d, int) and d > 0 for d in sb):
        return None
    a2 = ctx.op("Reshape", a, ctx.g.int64s([-1, sb[0]]))
    g2 = ctx.op("Reshape", gy, ctx.g.int64s([-1, sb[1]]))
    return _gemm_node(ctx, a2, g2, 1.0, 1, 0)


def _broadcast_batch(sa, sb):
    """numpy broadcast of two batch shapes; a symbolic dim wins over 1."""
    n = max(len(sa), len(sb))
    sa = (1,) * (n - len(sa)) + tuple(sa)
    sb = (1,) * (n - len(sb)) + tuple(sb)
    out = []
    for x, y in zip(sa, sb):
        if x == 1:
            out.append(y)
        elif y == 1 or x == y:
            out.append(x)
        else:
            out.append(x if y is None else (y if x is None else None))
    return tuple(out)


def _gemm_node(ctx, left, right, alpha, trans_a, trans_b):
    """Gemm without C (opset >= 11) or with a zero C (opset < 11)."""
    c = None if ctx.opset >= 11 else ctx.const(0)
    return ctx.op("Gemm", left, right, c, alpha=float(alpha),
                  transA=int(trans_a), transB=int(trans_b))


@register_vjp("Gemm")
def _gemm(ctx, gy):
    # Y = alpha * A' B' + beta * C with A' = A^T if transA, B' = B^T if transB
    a, b = ctx.inputs[:2]
    c = ctx.input(2)
    alpha, beta = ctx.attr("alpha", 1.0), ctx.attr("beta", 1.0)
    ta, tb = ctx.attr("transA", 0), ctx.attr("transB", 0)
    ga = gb = gc = None
    if ctx.needs_grad[0]:
        ga = (_gemm_node(ctx, b, gy, alpha, tb, 1) if ta
              else _gemm_node(ctx, gy, b, alpha, 0, 1 - tb))
    if ctx.needs_grad[1]:
        gb = (_gemm_node(ctx, gy, a, alpha, 1, ta) if tb
              else _gemm_node(ctx, a, gy, alpha, 1 - ta, 0))
    if c is not None and len(ctx.needs_grad) > 2 and ctx.needs_grad[2]:
        gc = gy if beta == 1.0 else ctx.op("Mul", gy, ctx.const(beta))
        gc = ctx.sum_to(gc, ctx.shape(ctx.outputs[0]), c)
    return (ga, gb, gc)[:len(ctx.inputs)]


def _einsum_terms(equation):
    """Operand subscripts and output subscripts (implicit output: the
    letters used once, in alphabetical order, as numpy.einsum)."""
    equation = equation.replace(" ", "")
    lhs, arrow, out = equation.partition("->")
    terms = lhs.split(",")
    if not arrow:
        letters = [c for c in lhs if c.isalpha()]
        out = ("..." if "..." in lhs else "") + "".join(
            sorted(c for c in set(letters) if letters.count(c) == 1))
    return terms, out


def _tokens(term):
    """The subscripts of ``term`` in order, an ellipsis as one token where
    it stands (``'i...j'`` -> ``['i', '...', 'j']``)."""
    head, ellipsis, tail = term.partition("...")
    return list(head) + ([ellipsis] if ellipsis else []) + list(tail)


@register_vjp("Einsum")
def _einsum(ctx, gy):
    # d operand_i = einsum(dy, other operands -> subscripts of operand i);
    # subscripts summed away from operand i alone come back by broadcasting,
    # a repeated subscript (a diagonal) by a mask (see _einsum_place)
    terms, out = _einsum_terms(ctx.attr("equation"))
    grads = []
    for i, x in enumerate(ctx.inputs):
        mine = _tokens(terms[i])
        if not ctx.needs_grad[i]:
            grads.append(None)
            continue
        others = terms[:i] + terms[i + 1:]
        if "..." in mine and any("..." in t for t in others):
            ctx.fail("an ellipsis in several operands (dims broadcast between them)")
        seen = set(_tokens(out)).union(*[set(_tokens(t)) for t in others])
        kept = [t for k, t in enumerate(mine) if t in seen and t not in mine[:k]]
        # an operand without the ellipsis the others broadcast over: onnx's
        # Einsum keeps an input's ellipsis in an explicit output, so the
        # gradient keeps it in front, then sums those axes away
        broadcast = "..." not in mine and "..." in out
        grad = ctx.op("Einsum", gy, *(ctx.inputs[:i] + ctx.inputs[i + 1:]),
                      equation=",".join([out] + others) + "->"
                      + ("..." if broadcast else "") + "".join(kept))
        if broadcast:
            width = ctx.rank(ctx.outputs[0], "Einsum") - (len(_tokens(out)) - 1)
            if width:
                grad = ctx.g.reduce_sum(grad, list(range(width)), keepdims=0)
        grads.append(_einsum_place(ctx, grad, x, mine, kept))
    return tuple(grads)


def _einsum_place(ctx, grad, x, mine, kept):
    """Bring a gradient over the subscripts ``kept`` to the shape of ``x``
    (subscripts ``mine``): unsqueeze the axes of the other subscripts (summed
    away from x alone, or second occurrences of a repeated one), expand,
    and for ``x[..., i, ..., i, ...]`` (a diagonal) multiply by the identity
    on those two axes: ``d x[.., i, .., j, ..] = [i == j] d diag[.., i, ..]``."""
    if kept == mine:
        return grad
    rank = ctx.rank(x, "Einsum")
    axes, k = [], 0  # the axes of each subscript of x
    for t in mine:
        width = rank - len(mine) + 1 if t == "..." else 1
        axes.append(list(range(k, k + width)))
        k += width
    first = {t: mine.index(t) for t in mine}
    placed = [a for k, t in enumerate(mine) if t not in kept or first[t] != k
              for a in axes[k]]
    grad = ctx.op("Expand", ctx.g.unsqueeze(grad, placed), ctx.g.shape_of(x))
    for k, t in enumerate(mine):
        if first[t] == k:
            continue
        p, q = axes[first[t]][0], axes[k][0]
        n = ctx.op("Gather", ctx.g.shape_of(x), ctx.g.int64s([p]))
        zeros = ctx.op("ConstantOfShape", ctx.op("Concat", n, n, axis=0),
                       value=helper.make_tensor("value", ctx.dtype, [1], [0]))
        eye, other = ctx.op("EyeLike", zeros), [
            a for a in range(rank) if a not in (p, q)]
        eye = ctx.g.unsqueeze(eye, other) if other else eye
        grad = ctx.op("Mul", grad, eye)
    return grad


@register_vjp("Det")
def _det(ctx, gy):
    """VJP of Det: ``d det(A) / dA = C``, the cofactor matrix,
    ``C[i, j] = (-1)^(i + j) det(M_ij)`` with ``M_ij`` the minor without
    row i and column j (Laplace expansion ``det A = sum_j A[i, j] C[i, j]``;
    Horn & Johnson, *Matrix Analysis*, 0.8.10). ONNX has no inverse, and
    ``det(A) A^-T`` fails for a singular A: the minors are gathered with
    constant indices, which needs a static matrix size n, and each batch of
    ``n * n`` minors goes through Det.

    Raises
    ------
    NotImplementedError
        If n (the last two dimensions) is not static.
    """
    a = ctx.inputs[0]
    shape = ctx.shape(a)
    n = None if shape is None else shape[-1]
    if not isinstance(n, int):
        ctx.fail(f"a matrix size n that is not static (shape {shape}): the "
                 "cofactors are gathered with constant indices")
    rank = len(shape)
    gy = ctx.g.unsqueeze(gy, [rank - 2, rank - 1])
    if n == 1:
        return gy
    keep = np.array([[k for k in range(n) if k != i] for i in range(n)])
    keep = ctx.const(keep, TensorProto.INT64)
    rows = ctx.op("Gather", a, keep, axis=rank - 2)  # [..., i, r, n]
    minors = ctx.op("Gather", rows, keep, axis=rank)  # [..., i, r, j, c]
    minors = ctx.op("Transpose", minors, perm=list(range(rank - 2)) + [
        rank - 2, rank, rank - 1, rank + 1])
    signs = ctx.const(1 - 2 * (np.add.outer(np.arange(n), np.arange(n)) % 2))
    return ctx.op("Mul", ctx.op("Mul", ctx.op("Det", minors), signs), gy)
