"""Links and chains (onnxtrain.optim.links, ChainedRule, chain): one row per
link against a numpy reference, with the link active; chains against
PyTorch (clip_grad_norm_, clip_grad_value_, SGD, AdamW); the order of the
links; bad parameters; chained learning rates in estimators (clone,
pickle, GridSearchCV) and in onnxblock's optimizer model."""
import pickle

import numpy as np
import onnxruntime
import pytest
from numpy.testing import assert_allclose
from onnx import TensorProto
from sklearn.base import clone
from sklearn.model_selection import GridSearchCV

from onnxtrain.graph._small import finish, new_builder, tensor_input
from onnxtrain.optim import (AddDecayedWeights, AddPenalty, ChainedRule,
                             ClipByGlobalNorm, ClipByValue,
                             DecoupledWeightDecay, GradientLink,
                             LearningRateAdam, LearningRateChain,
                             LearningRateSGD, LearningRateSGDNesterov, chain,
                             check_learning_rate)
from onnxtrain.optim import links as links_module
from onnxtrain.penalties import ElasticLearningPenalty
from onnxtrain.update_rules import AdamRule, AdamWRule, MomentumRule, SGDRule

SHAPES = [(3, 2), (2,), (4,)]
RATES = [0.1, 0.05, 0.2, 0.01, 0.07]
PENALTY_SCALE = 0.25


# ------------------------------------------------------------ the harness
def _session(rule, dtype=TensorProto.DOUBLE):
    """A session of :func:`_model`."""
    return onnxruntime.InferenceSession(_model(rule, dtype).SerializeToString(),
                                        providers=["CPUExecutionProvider"])


def _model(rule, dtype=TensorProto.DOUBLE):
    """A graph running ``rule.update_all`` on the parameters ``p0, p1...``
    (keys ``w0, w1...``): inputs learning_rate, step, penalty_scale, loss,
    then each parameter, its gradient and states; outputs loss_total then
    each parameter's new value and states."""
    g = new_builder(17)
    head = ["learning_rate", "step", "penalty_scale", "loss"]
    inputs = [tensor_input(n, dtype, []) for n in head]
    outputs = [tensor_input("loss_total", dtype, [])]
    g.reserve("loss_total")
    params, grads, states, news = [], [], [], []
    for i, shape in enumerate(SHAPES):
        names = [f"p{i}", f"g{i}"] + [f"p{i}_{s}" for s in rule.state_names]
        new = [f"p{i}_new"] + [f"p{i}_{s}_new" for s in rule.state_names]
        for n in names + new:
            g.reserve(n)
        for n in names:
            g.set_type(n, dtype, shape)
        inputs += [tensor_input(n, dtype, shape) for n in names]
        outputs += [tensor_input(n, dtype, shape) for n in new]
        params.append(names[0])
        grads.append(names[1])
        states.append(names[2:])
        news.append(new)
    scalars = {n: n for n in head[:3]}
    _, _, terms = rule.update_all(g, dtype, params, grads, states, scalars, news,
                                  keys=[f"w{i}" for i in range(len(SHAPES))])
    total = "loss"
    for term in terms:
        total = g.op("Add", total, term)
    g.op("Identity", total, outputs=["loss_total"])
    return finish(g, "chain", inputs, outputs)


def _run(rule, params, grads_seq, rates=RATES):
    """Final parameters and the loss_total of each step (loss fed as 0)."""
    sess = _session(rule)
    params = [p.copy() for p in params]
    states = [rule.init(p.shape, p.dtype) for p in params]
    width = 1 + len(rule.state_names)
    totals = []
    for step, (lr, grads) in enumerate(zip(rates, grads_seq), start=1):
        feeds = {"learning_rate": np.array(lr), "step": np.array(float(step)),
                 "penalty_scale": np.array(PENALTY_SCALE), "loss": np.array(0.0)}
        for i, (p, gr, st) in enumerate(zip(params, grads, states)):
            feeds[f"p{i}"], feeds[f"g{i}"] = p, gr
            feeds.update({f"p{i}_{s}": v for s, v in zip(rule.state_names, st)})
        out = sess.run(None, feeds)
        totals.append(float(out[0]))
        out = out[1:]
        params = out[::width]
        states = [out[i * width + 1:(i + 1) * width] for i in range(len(SHAPES))]
    return params, totals


def _data(scale=3.0, seed=3):
    rng = np.random.RandomState(seed)
    params = [rng.randn(*s) for s in SHAPES]
    grads_seq = [[scale * rng.randn(*s) for s in SHAPES] for _ in RATES]
    return params, grads_seq


# --------------------------------------------------------- numpy references
def _global_norm(grads):
    return np.sqrt(sum(float((g * g).sum()) for g in grads))


def np_clip_by_global_norm(max_norm):
    """torch.nn.utils.clip_grad_norm_'s formula."""
    def link(params, grads, lr):
        factor = min(1.0, max_norm / (_global_norm(grads) + 1e-6))
        return params, [g * factor for g in grads], 0.0
    return link


def np_clip_by_value(value):
    def link(params, grads, lr):
        return params, [np.clip(g, -value, value) for g in grads], 0.0
    return link


def np_add_decayed_weights(wd):
    def link(params, grads, lr):
        return params, [g + wd * p for p, g in zip(params, grads)], 0.0
    return link


def np_decoupled_weight_decay(wd):
    def link(params, grads, lr):
        return [p - p * (lr * wd) for p in params], grads, 0.0
    return link


def np_penalty(l1, l2, penalized):
    """ElasticLearningPenalty on the parameters ``penalized`` (indices)."""
    def link(params, grads, lr):
        new, total = [], 0.0
        for i, (p, g) in enumerate(zip(params, grads)):
            if i in penalized:
                g = g + PENALTY_SCALE * (l1 * np.sign(p) + 2 * l2 * p)
                total += PENALTY_SCALE * (l1 * np.abs(p).sum() + l2 * (p * p).sum())
            new.append(g)
        return params, new, total
    return link


def _np_sgd(links, params, grads_seq, rates=RATES):
    """The links then SGD, in numpy; the final parameters and the penalty
    of each step."""
    params = [p.copy() for p in params]
    totals = []
    for lr, grads in zip(rates, grads_seq):
        total = 0.0
        start = params
        for link in links:
            start, grads, term = link(start, grads, lr)
            total += term
        params = [p - lr * g for p, g in zip(start, grads)]
        totals.append(total)
    return params, totals


ROWS = [
    ("clip-by-global-norm", ClipByGlobalNorm(2.0), np_clip_by_global_norm(2.0)),
    ("clip-by-value", ClipByValue(1.5), np_clip_by_value(1.5)),
    ("add-decayed-weights", AddDecayedWeights(0.3), np_add_decayed_weights(0.3)),
    ("decoupled-weight-decay", DecoupledWeightDecay(0.4),
     np_decoupled_weight_decay(0.4)),
    ("add-penalty", AddPenalty(ElasticLearningPenalty(0.1, 0.2), {"w0", "w2"}),
     np_penalty(0.1, 0.2, {0, 2})),
]


def test_every_link_has_a_row():
    public = {cls for cls in vars(links_module).values()
              if isinstance(cls, type) and issubclass(cls, GradientLink)
              and cls is not GradientLink}
    assert {type(row[1]) for row in ROWS} == public


@pytest.mark.parametrize("name,link,reference", ROWS, ids=[r[0] for r in ROWS])
def test_link_matches_numpy(name, link, reference):
    params, grads_seq = _data()
    got, totals = _run(chain(link, SGDRule()), params, grads_seq)
    expected, expected_totals = _np_sgd([reference], params, grads_seq)
    for a, b in zip(got, expected):
        assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    assert_allclose(totals, expected_totals, rtol=1e-12, atol=1e-14)
    # the link did something: plain SGD ends elsewhere
    plain, _ = _np_sgd([], params, grads_seq)
    assert max(np.abs(a - b).max() for a, b in zip(got, plain)) > 1e-3


def test_decoupled_weight_decay_is_one_product_per_parameter():
    # param * (1 - lr wd): one pass over each parameter, the scalar
    # 1 - lr wd computed once for all (param - param * lr wd is two)
    nodes = _model(chain(DecoupledWeightDecay(0.4), SGDRule())).graph.node
    for i in range(len(SHAPES)):
        readers = [n for n in nodes if f"p{i}" in n.input]
        assert [n.op_type for n in readers] == ["Mul"], readers
    scalars = {n.input[1] for n in nodes if n.input and n.input[0] in
               {f"p{i}" for i in range(len(SHAPES))}}
    assert len(scalars) == 1


def test_the_clipping_rows_clip():
    """The data make both clipping links active (and not on everything)."""
    params, grads_seq = _data()
    assert min(_global_norm(grads) for grads in grads_seq) > 2.0
    elements = np.concatenate([g.ravel() for grads in grads_seq for g in grads])
    assert 0.1 < np.mean(np.abs(elements) > 1.5) < 0.9


def test_clip_by_global_norm_below_the_norm_changes_nothing():
    params, grads_seq = _data(scale=0.01)
    assert max(_global_norm(grads) for grads in grads_seq) < 1.0
    got, _ = _run(chain(ClipByGlobalNorm(1.0), SGDRule()), params, grads_seq)
    plain, _ = _run(SGDRule(), params, grads_seq)
    for a, b in zip(got, plain):
        assert_allclose(a, b, rtol=1e-15)


# ------------------------------------------------------------ torch oracle
def _torch_run(params, grads_seq, make_optimizer, clip, rates=RATES):
    torch = pytest.importorskip("torch")
    tensors = [torch.tensor(p, dtype=torch.float64, requires_grad=True)
               for p in params]
    opt = make_optimizer(torch, tensors)
    for lr, grads in zip(rates, grads_seq):
        for group in opt.param_groups:
            group["lr"] = lr
        for t, grad in zip(tensors, grads):
            t.grad = torch.tensor(grad)
        clip(torch, tensors)
        opt.step()
    return [t.detach().numpy() for t in tensors]


def _clip_norm(max_norm):
    def clip(torch, tensors):
        total = torch.nn.utils.clip_grad_norm_(tensors, max_norm)
        assert float(total) > max_norm  # active
    return clip


def _clip_value(value):
    def clip(torch, tensors):
        assert any(float(t.grad.abs().max()) > value for t in tensors)  # active
        torch.nn.utils.clip_grad_value_(tensors, value)
    return clip


CONSTANT = [0.05] * len(RATES)
TORCH_ROWS = [
    # torch's momentum buffer equals scikit-learn's velocity at a constant rate
    ("clip-norm+sgd-momentum-weight-decay",
     chain(ClipByGlobalNorm(2.0), AddDecayedWeights(0.1), MomentumRule(0.9)),
     lambda torch, ts: torch.optim.SGD(ts, lr=0.05, momentum=0.9, weight_decay=0.1),
     _clip_norm(2.0), CONSTANT),
    ("clip-norm+adamw",
     chain(ClipByGlobalNorm(2.0), AdamWRule(0.85, 0.98, 0.0, weight_decay=0.1)),
     lambda torch, ts: torch.optim.AdamW(ts, lr=0.1, betas=(0.85, 0.98), eps=0.0,
                                         weight_decay=0.1),
     _clip_norm(2.0), RATES),
    ("clip-norm+decoupled-decay+adam",
     chain(ClipByGlobalNorm(2.0), DecoupledWeightDecay(0.1), AdamRule(0.85, 0.98, 0.0)),
     lambda torch, ts: torch.optim.AdamW(ts, lr=0.1, betas=(0.85, 0.98), eps=0.0,
                                         weight_decay=0.1),
     _clip_norm(2.0), RATES),
    ("clip-value+sgd",
     chain(ClipByValue(1.5), SGDRule()),
     lambda torch, ts: torch.optim.SGD(ts, lr=0.1),
     _clip_value(1.5), RATES),
]


@pytest.mark.parametrize("name,rule,make_optimizer,clip,rates", TORCH_ROWS,
                         ids=[r[0] for r in TORCH_ROWS])
def test_chain_matches_torch(name, rule, make_optimizer, clip, rates):
    """Several steps of a chain against PyTorch clipping then stepping
    (torch.optim.AdamW with eps=0: PyTorch adds eps after the bias
    correction of sqrt(v), scikit-learn's formula before)."""
    params, grads_seq = _data()
    expected = _torch_run(params, grads_seq, make_optimizer, clip, rates)
    got, _ = _run(rule, params, grads_seq, rates)
    for a, b in zip(got, expected):
        assert_allclose(a, b, rtol=1e-10, atol=1e-12)


# ------------------------------------------------------------- link order
def test_clip_then_decay_differs_from_decay_then_clip():
    """Coupled decay before the clipping is clipped with the gradient:
    clip(g + wd p) against clip(g) + wd p, as the formulas say."""
    params, grads_seq = _data()
    clip, decay = np_clip_by_global_norm(2.0), np_add_decayed_weights(0.5)
    first = _run(chain(ClipByGlobalNorm(2.0), AddDecayedWeights(0.5), SGDRule()),
                 params, grads_seq)[0]
    second = _run(chain(AddDecayedWeights(0.5), ClipByGlobalNorm(2.0), SGDRule()),
                  params, grads_seq)[0]
    for a, b in zip(first, _np_sgd([clip, decay], params, grads_seq)[0]):
        assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    for a, b in zip(second, _np_sgd([decay, clip], params, grads_seq)[0]):
        assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    assert max(np.abs(a - b).max() for a, b in zip(first, second)) > 1e-2


def test_decoupled_decay_commutes_with_clipping():
    """The decoupled decay never reaches the gradient: before or after the
    clipping, the same update."""
    params, grads_seq = _data()
    first = _run(chain(ClipByGlobalNorm(2.0), DecoupledWeightDecay(0.5), SGDRule()),
                 params, grads_seq)[0]
    second = _run(chain(DecoupledWeightDecay(0.5), ClipByGlobalNorm(2.0), SGDRule()),
                  params, grads_seq)[0]
    for a, b in zip(first, second):
        assert_allclose(a, b, rtol=1e-14)


def test_adam_weight_decay_is_the_decay_link_then_adam():
    params, grads_seq = _data()
    rule = AdamRule(0.8, 0.99, 1e-7, weight_decay=0.2)
    assert rule.as_chain() == ChainedRule([DecoupledWeightDecay(0.2)],
                                          AdamRule(0.8, 0.99, 1e-7))
    chained = chain(DecoupledWeightDecay(0.2), AdamRule(0.8, 0.99, 1e-7))
    for a, b in zip(_run(rule, params, grads_seq)[0],
                    _run(chained, params, grads_seq)[0]):
        assert_allclose(a, b, rtol=1e-15)


def test_chains_flatten_and_keep_the_rule_state():
    inner = chain(ClipByValue(1.0), AdamRule())
    outer = chain(ClipByGlobalNorm(1.0), inner)
    assert outer == ChainedRule([ClipByGlobalNorm(1.0), ClipByValue(1.0)], AdamRule())
    assert outer.state_names == ("m", "v") and outer.reads_step
    assert [s.shape for s in outer.init((2, 3), np.float32)] == [(2, 3), (2, 3)]


def test_one_parameter_update_refuses_a_global_link():
    g = new_builder(17)
    with pytest.raises(ValueError, match="update_all"):
        chain(ClipByGlobalNorm(1.0), SGDRule()).update(
            g, TensorProto.FLOAT, "p", "g", [], {"learning_rate": "lr"})
    assert g.nodes == []


# ---------------------------------------------------------- bad parameters
BAD = [
    (ClipByGlobalNorm(-1.0), "max_norm"), (ClipByGlobalNorm(0), "max_norm"),
    (ClipByGlobalNorm(float("nan")), "max_norm"),
    (ClipByGlobalNorm(float("inf")), "max_norm"), (ClipByGlobalNorm(True), "max_norm"),
    (ClipByGlobalNorm("1"), "max_norm"),
    (ClipByValue(-0.5), "clip_value"), (ClipByValue(float("nan")), "clip_value"),
    (AddDecayedWeights(-0.1), "weight_decay"),
    (DecoupledWeightDecay(float("nan")), "weight_decay"),
    (AddPenalty(penalty="l2"), "penalty"),
]


@pytest.mark.parametrize("link,name", BAD, ids=[repr(b[0]) for b in BAD])
def test_bad_parameters_are_refused_before_any_node(link, name):
    with pytest.raises(ValueError, match=f"{type(link).__name__}: {name} must be"):
        link.check()
    with pytest.raises(ValueError, match=name):
        chain(link, LearningRateSGD())
    g = new_builder(17)
    with pytest.raises(ValueError, match=name):
        ChainedRule([link], SGDRule()).update_all(
            g, TensorProto.FLOAT, ["p"], ["g"], [[]],
            {"learning_rate": "lr", "penalty_scale": "s"})
    assert g.nodes == [] and g.initializers == []


def test_bad_chains_are_refused():
    with pytest.raises(TypeError, match="at least one step"):
        chain()
    with pytest.raises(TypeError, match="GradientLink"):
        chain(SGDRule(), SGDRule())
    with pytest.raises(TypeError, match="last step"):
        chain(ClipByValue(1.0), ClipByValue(2.0))
    with pytest.raises(ValueError, match="last step 'clip' must be a learning-rate"):
        check_learning_rate(LearningRateChain([("sgd", LearningRateSGD()),
                                               ("clip", ClipByValue())]))
    with pytest.raises(ValueError, match="step 'sgd' must be a GradientLink"):
        check_learning_rate(LearningRateChain([("sgd", LearningRateSGD()),
                                               ("adam", LearningRateAdam())]))
    with pytest.raises(ValueError, match="unique"):
        check_learning_rate(LearningRateChain([("a", ClipByValue()),
                                               ("a", LearningRateSGD())]))
    with pytest.raises(ValueError, match="non-empty list"):
        check_learning_rate(LearningRateChain([]))
    with pytest.raises(ValueError, match="eta0"):  # the last step is checked too
        chain(ClipByValue(1.0), LearningRateSGD(eta0=-1.0))


def test_chain_names_its_steps_as_make_pipeline():
    rate = chain(ClipByValue(1.0), ClipByValue(2.0), ClipByGlobalNorm(1.0),
                 LearningRateAdam())
    assert [n for n, _ in rate.steps] == ["clipbyvalue-1", "clipbyvalue-2",
                                          "clipbyglobalnorm", "learningrateadam"]


# --------------------------------------------------- the learning-rate object
def test_learning_rate_chain_delegates_to_its_last_step():
    sgd = LearningRateSGDNesterov(0.1, learning_rate="adaptive")
    rate = chain(ClipByGlobalNorm(1.0), sgd)
    assert rate.state_names == ("velocity",) and rate.learning_rate == "adaptive"
    rate.init_learning_rate()
    assert rate.value == sgd.value == 0.1
    assert not rate.trigger_stopping()  # adaptive: divided by 5
    assert sgd.value == pytest.approx(0.02)
    assert rate.step_scalars(3) == sgd.step_scalars(3)
    assert rate.update_rule() == ChainedRule([ClipByGlobalNorm(1.0)],
                                             MomentumRule(0.9, True))
    assert not hasattr(chain(ClipByValue(), LearningRateAdam()), "learning_rate")


def test_get_and_set_params_reach_the_steps():
    rate = LearningRateChain([("clip", ClipByGlobalNorm(1.0)),
                              ("sgd", LearningRateSGD(0.1))])
    params = rate.get_params()
    assert params["clip__max_norm"] == 1.0 and params["sgd__eta0"] == 0.1
    rate.set_params(clip__max_norm=0.5, sgd__eta0=0.2)
    assert rate.steps[0][1].max_norm == 0.5 and rate.steps[1][1].eta0 == 0.2
    rate.set_params(clip=ClipByValue(0.3))
    assert rate.steps[0] == ("clip", ClipByValue(0.3))
    with pytest.raises(ValueError, match="Invalid parameter 'clop'"):
        rate.set_params(clop__max_norm=1.0)


def test_build_onnx_of_a_chain_clips():
    """The split path's update graph (axpy_onnx_) of a chain."""
    rate = chain(ClipByGlobalNorm(1.0), LearningRateSGD(0.1))
    model = rate.build_onnx([("W", (3,)), ("B", (2,))], TensorProto.DOUBLE, 17)
    sess = onnxruntime.InferenceSession(model.SerializeToString(),
                                        providers=["CPUExecutionProvider"])
    w, b, gw, gb = np.ones(3), np.zeros(2), np.full(3, 3.0), np.full(2, 4.0)
    feeds = {"learning_rate": np.array(0.1), "step": np.array(1.0),
             "loss": np.array(2.0), "penalty_scale": np.array(1.0),
             "W": w, "W_grad": gw, "B": b, "B_grad": gb}
    new_w, new_b, total = sess.run(None, feeds)
    norm = np.sqrt(9 * 3 + 16 * 2)
    factor = 1.0 / (norm + 1e-6)
    assert_allclose(new_w, w - 0.1 * gw * factor, rtol=1e-14)
    assert_allclose(new_b, b - 0.1 * gb * factor, rtol=1e-14)
    assert float(total) == 2.0


# ------------------------------------------------------- in the estimators
@pytest.fixture(scope="module")
def linear():
    from linear_models import linear_model
    rng = np.random.RandomState(0)
    X = rng.randn(60, 3).astype(np.float32)
    y = (X @ np.array([3.0, -2.0, 1.0]) + 0.5).astype(np.float32)
    return X, y, linear_model(3, 1, scale=0.1)


def _estimator(onx, rate, **kwargs):
    from onnxtrain.estimators import OrtGradientForwardBackwardOptimizer
    return OrtGradientForwardBackwardOptimizer(
        onx, learning_rate=rate, max_iter=4, batch_size=20, random_state=0,
        **kwargs)


def _clipped_sgd(max_norm=0.05):
    return chain(ClipByGlobalNorm(max_norm), LearningRateSGD(0.05, learning_rate="constant"))


def test_estimator_clones_and_pickles_a_chain(linear):
    X, y, onx = linear
    est = _estimator(onx, _clipped_sgd())
    copy = clone(est)
    assert copy.learning_rate is not est.learning_rate
    assert copy.learning_rate.steps[0][1] is not est.learning_rate.steps[0][1]
    assert copy.get_params()["learning_rate__clipbyglobalnorm__max_norm"] == 0.05
    est.fit(X, y)
    restored = pickle.loads(pickle.dumps(est))
    assert_allclose(restored.predict(X), est.predict(X), rtol=0)
    assert restored.learning_rate.steps[0][1] == ClipByGlobalNorm(0.05)
    # both go on training the same way
    est.partial_fit(X, y)
    restored.partial_fit(X, y)
    assert_allclose(restored.predict(X), est.predict(X), rtol=1e-6)


def test_estimator_trains_the_chain(linear):
    """The fit with clipping against the same fit without: clipping at
    0.05 slows SGD down on this data (the gradients' norm is ~5)."""
    X, y, onx = linear
    clipped = _estimator(onx, _clipped_sgd()).fit(X, y)
    plain = _estimator(onx, LearningRateSGD(0.05, learning_rate="constant")).fit(X, y)
    assert clipped.train_losses_[-1] > 2 * plain.train_losses_[-1]


def test_estimator_refuses_a_bad_link_before_any_work(linear):
    X, y, onx = linear
    before = onx.SerializeToString()
    est = _estimator(onx, LearningRateChain([("clip", ClipByGlobalNorm(float("nan"))),
                                             ("sgd", LearningRateSGD())]))
    with pytest.raises(ValueError, match="ClipByGlobalNorm: max_norm must be"):
        est.fit(X, y)
    assert not hasattr(est, "weights_to_train_")
    assert onx.SerializeToString() == before


def test_grid_search_over_a_clipping_parameter(linear):
    X, y, onx = linear
    search = GridSearchCV(_estimator(onx, _clipped_sgd()),
                          {"learning_rate__clipbyglobalnorm__max_norm": [0.01, 100.0]},
                          cv=2)
    search.fit(X, y)
    scores = search.cv_results_["mean_test_score"]
    assert scores[1] > scores[0] + 0.1  # clipping at 0.01 barely moves the weights
    assert search.best_params_ == {"learning_rate__clipbyglobalnorm__max_norm": 100.0}
    assert search.best_estimator_.learning_rate.steps[0][1].max_norm == 100.0


# ------------------------------------------------------- onnxblock / api
def test_optimizer_model_of_a_chain_matches_numpy():
    """build_optimizer_model of a chained rule: SGD after global clipping and
    coupled decay, run by onnxruntime."""
    from onnxtrain.onnxblock.optim import OPTIMIZER_METADATA, build_optimizer_model
    rule = chain(ClipByGlobalNorm(2.0), AddDecayedWeights(0.1), SGDRule())
    specs = [(f"p{i}", TensorProto.DOUBLE, list(s)) for i, s in enumerate(SHAPES)]
    model = build_optimizer_model(rule, specs)
    metadata = {p.key: p.value for p in model.metadata_props}
    assert '"optimizer": "RuleOptimizer"' in metadata[OPTIMIZER_METADATA]
    sess = onnxruntime.InferenceSession(model.SerializeToString(),
                                        providers=["CPUExecutionProvider"])
    params, grads_seq = _data()
    expected = _np_sgd([np_clip_by_global_norm(2.0), np_add_decayed_weights(0.1)],
                       params[:], grads_seq[:1], RATES[:1])[0]
    feeds = {"learning_rate": np.array(RATES[0]), "step": np.array(1, dtype=np.int64)}
    for i, (p, gr) in enumerate(zip(params, grads_seq[0])):
        feeds[f"p{i}"], feeds[f"p{i}_grad"] = p, gr
    for a, b in zip(sess.run(None, feeds), expected):
        assert_allclose(a, b, rtol=1e-12)


def test_optimizer_model_refuses_what_it_cannot_hold():
    from onnxtrain.onnxblock.optim import RuleOptimizer, build_optimizer_model
    with pytest.raises(ValueError, match="penalty link"):
        RuleOptimizer(chain(AddPenalty(ElasticLearningPenalty()), SGDRule()))
    with pytest.raises(ValueError, match="max_norm"):
        RuleOptimizer(chain(ClipByGlobalNorm(-2.0), SGDRule()))
    with pytest.raises(TypeError, match="UpdateRule"):
        RuleOptimizer(LearningRateSGD())
    mixed = [("a", TensorProto.FLOAT, [2]), ("b", TensorProto.DOUBLE, [2])]
    with pytest.raises(ValueError, match="several element types"):
        build_optimizer_model(chain(ClipByGlobalNorm(1.0), SGDRule()), mixed)
    # a chain of per-parameter links takes several element types
    model = build_optimizer_model(chain(ClipByValue(1.0), SGDRule()), mixed)
    assert [o.name for o in model.graph.output] == ["a.updated", "b.updated"]


@pytest.mark.parametrize("opset", [9, 17])
def test_clip_by_value_at_every_opset(opset):
    """Clip takes its bounds as inputs from opset 11; Min and Max before."""
    from onnxtrain.onnxblock.optim import build_optimizer_model
    model = build_optimizer_model(chain(ClipByValue(0.5), SGDRule()),
                                  [("p", TensorProto.FLOAT, [4])], opset)
    ops = {n.op_type for n in model.graph.node}
    assert ("Clip" in ops) == (opset >= 11)
    sess = onnxruntime.InferenceSession(model.SerializeToString(),
                                        providers=["CPUExecutionProvider"])
    grad = np.array([-2.0, -0.25, 0.3, 7.0], dtype=np.float32)
    (new,) = sess.run(None, {"learning_rate": np.array(0.1),
                             "step": np.array(1, dtype=np.int64),
                             "p": np.zeros(4, np.float32), "p_grad": grad})
    assert_allclose(new, -0.1 * np.clip(grad, -0.5, 0.5), rtol=1e-6)


def test_clip_by_global_norm_sums_float16_squares_in_float32():
    """Squares summing past float16's 65504 still give the true norm."""
    g = new_builder(17)
    for n in ["lr", "p", "g", "p_new"]:
        g.reserve(n)
    half = TensorProto.FLOAT16
    chain(ClipByGlobalNorm(1.0), SGDRule()).update_all(
        g, half, ["p"], ["g"], [[]], {"learning_rate": "lr"}, [["p_new"]])
    model = finish(g, "half", [tensor_input("lr", half, []),
                               tensor_input("p", half, [300]),
                               tensor_input("g", half, [300])],
                   [tensor_input("p_new", half, [300])])
    sess = onnxruntime.InferenceSession(model.SerializeToString(),
                                        providers=["CPUExecutionProvider"])
    grad = np.full(300, 100.0, np.float16)  # norm sqrt(3e6), squares 1e4 each
    (new,) = sess.run(None, {"lr": np.array(1.0, np.float16),
                             "p": np.zeros(300, np.float16), "g": grad})
    assert np.linalg.norm(new.astype(np.float64)) == pytest.approx(1.0, rel=1e-3)
