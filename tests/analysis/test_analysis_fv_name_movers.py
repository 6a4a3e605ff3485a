"""Function-vector heads and name movers: the ICL task sets, the AIE against a full-forward reference, hand-built
models whose answer is known (tests/toy_kinds.py), the causal metrics and the bad input."""

import pytest
import torch
from toy_kinds import FV_PAIRS, fv_model, ioi_like_prompts, name_mover_model
from toy_models import hand_built_model

from interp.analysis import classify_heads
from interp.analysis.function_vector import function_vector_effects, icl_accuracy, task_mean_z
from interp.analysis.kind_causal import kind_metric
from interp.analysis.kinds import head_kinds
from interp.analysis.name_mover import io_positions, name_copying_scores
from interp.config import ModelConfig
from interp.data.circuit_tasks import TaskPrompts
from interp.data.icl import ICL_TASKS, icl_prompts, icl_token_pairs, split_pairs
from interp.model import Transformer


def fv_prompts(n=6, shots=3, seed=0):
    return icl_prompts(FV_PAIRS, n, shots, bos_id=0, seed=seed)


# --- the ICL task sets --------------------------------------------------------------------------------------
def test_icl_prompts_pair_demonstrations_and_shuffle_every_label():
    pairs = {"t": [(x, x + 100) for x in range(1, 11)], "u": [([x, x], [x + 50]) for x in range(1, 9)]}
    p = icl_prompts(pairs, 5, 4, bos_id=0, between=[99], after=[98], seed=3)
    assert len(p) == 10 and p.tasks == ["t"] * 5 + ["u"] * 5
    for clean, corrupt, answer, task in zip(p.clean, p.corrupted, p.answers, p.tasks):
        assert clean[0] == 0 and clean[-1] == 99 and len(clean) == len(corrupt)
        width = 4 if task == "t" else 5  # x (1 or 2 tokens) : y \n
        demos = clean[1:1 + 4 * width].view(4, width)
        bad = corrupt[1:1 + 4 * width].view(4, width)
        x, y, y_bad = demos[:, 0], demos[:, -2], bad[:, -2]
        assert torch.equal(y, x + (100 if task == "t" else 50))  # the clean demonstrations are right
        assert torch.equal(bad[:, :-2], demos[:, :-2])  # inputs and separators stay
        assert (y_bad != y).all() and sorted(y_bad.tolist()) == sorted(y.tolist())  # a derangement of the labels
        assert torch.equal(corrupt[1 + 4 * width:], clean[1 + 4 * width:])  # the query stays
        query = clean[1 + 4 * width]
        assert answer == query + (100 if task == "t" else 50) and query not in x  # a fresh query
    assert [len(g) for g in p.groups()] == [5, 5]


def test_icl_task_with_one_example_is_refused_by_value():
    with pytest.raises(ValueError, match=r"ICL task 'capital' has 1 example\(s\); 2 demonstrations and a query"):
        icl_prompts({"capital": [("France", "Paris")]}, 4, 2)
    with pytest.raises(ValueError, match=r"n_shots=1 must be an int >= 2 \(shuffling the labels of one"):
        icl_prompts(FV_PAIRS, 4, 1)
    with pytest.raises(ValueError, match="is empty"):
        icl_prompts({"t": [([], [1])] * 4}, 1, 2)


def test_icl_tasks_tokenize_and_split_disjointly():
    class Chars:  # one token per character: an independent stand-in tokenizer
        def encode(self, text, add_special_tokens=False):
            return [ord(c) for c in text]

    pairs = icl_token_pairs(Chars())
    assert list(pairs) == list(ICL_TASKS) and len(ICL_TASKS) >= 5
    assert pairs["antonym"][0] == ([ord("h"), ord("o"), ord("t")], [ord(" "), ord("c"), ord("o"), ord("l"), ord("d")])
    parts = split_pairs(pairs, 3)
    for task, every in pairs.items():
        got = [pair for part in parts for pair in part[task]]
        assert sorted(got) == sorted(every)  # a partition ...
        inputs = [{tuple(x) for x, _ in part[task]} for part in parts]
        assert not (inputs[0] & inputs[1]) and not (inputs[1] & inputs[2])  # ... with no input shared


# --- function-vector heads ------------------------------------------------------------------------------------
def test_function_vector_head_is_found_and_no_other_head(one_thread):
    p = fv_prompts()
    report = classify_heads(fv_model(), kinds=["function-vector"], options={"icl_prompts": p}, bootstrap=200,
                            progress=False)
    assert report.as_dict() == {(1, 0): {"function-vector"}}
    aie = report.details["function-vector"].set_index(["layer", "head"]).aie
    assert aie[(1, 0)] > 0.4  # the task direction turns the default token into the answer
    for head in [(0, 0), (0, 1), (1, 1)]:
        assert abs(aie[head]) < 1e-6  # the pair detector works upstream; the others write a dead dimension
    row = report.df.iloc[0]
    assert row.low > 0.01 and not row.uncertain
    assert "10 ICL prompts" not in report.probes["function-vector"] and "shift" in report.probes["function-vector"]


def test_effects_equal_a_full_forward_reference_on_a_random_gqa_model(one_thread):
    torch.manual_seed(0)
    cfg = ModelConfig(n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, d_vocab=40, n_ctx=64, positional="rotary")
    model = Transformer(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3)
    pairs = {"a": [(x, [x + 10, x + 20][: 1 + x % 2]) for x in range(1, 9)],  # outputs of 1 or 2 tokens
             "b": [([x, x + 1], x + 5) for x in range(20, 28)]}
    p = icl_prompts(pairs, 3, 3, bos_id=0, between=[39], after=[38], seed=1)
    assert len(p.groups()) > 1  # several prompt lengths
    effects = function_vector_effects(model, p)
    # Reference: the task-mean z and every patched prompt from plain full forward passes, one prompt at a time.
    z = {}
    for i, prompt in enumerate(p.clean):
        _, cache = model.run_with_cache(prompt[None], names_filter=lambda n: n.endswith("hook_z"))
        z[i] = {layer: cache[f"blocks.{layer}.attn.hook_z"][0, -1] for layer in range(2)}  # [H, D]
    for i, (prompt, task) in enumerate(zip(p.corrupted, p.tasks)):
        same = [j for j, t in enumerate(p.tasks) if t == task]
        with torch.no_grad():
            base = model(prompt[None])[0, -1].softmax(-1)[p.answers[i]]
            for layer in range(2):
                mean = torch.stack([z[j][layer] for j in same]).mean(0)  # [H, D]
                for head in range(4):
                    def patch(t, hook, head=head, mean=mean):
                        t = t.clone()
                        t[:, -1, head] = mean[head]
                        return t
                    with model.hooks([(f"blocks.{layer}.attn.hook_z", patch)]):
                        patched = model(prompt[None])[0, -1].softmax(-1)[p.answers[i]]
                    assert abs(float(effects[layer, head, i]) - float(patched - base)) < 1e-5
    means = task_mean_z(model, p)
    assert torch.allclose(means["b"][1], torch.stack([z[j][1] for j in range(3, 6)]).mean(0), atol=1e-6)


def test_icl_accuracy_drops_only_without_the_function_vector_head():
    model, p = fv_model(), fv_prompts()
    per = icl_accuracy(model, p, method="zero")
    assert per([]).tolist() == [1.0] * len(p)  # the hand-built model solves the task in context
    assert per([(1, 0)]).tolist() == [0.0] * len(p)  # no task direction: the default token wins
    assert per([(1, 1), (0, 1)]).tolist() == [1.0] * len(p)
    with pytest.raises(ValueError, match="method='resample'"):
        icl_accuracy(model, p, method="resample")


def test_kinds_without_their_data_say_so():
    r = classify_heads(hand_built_model(), kinds=["function-vector", "name-mover"], progress=False)
    assert len(r.df) == 0
    assert r.probes["function-vector"].startswith("not measured")
    assert r.probes["name-mover"].startswith("not measured")
    with pytest.raises(ValueError, match=r"unknown head kind\(s\) \['function-vectr'\].*'function-vector'"):
        classify_heads(hand_built_model(), kinds=["function-vectr"])
    with pytest.raises(ValueError, match="icl_prompts=list: give an interp.data.icl.ICLPrompts"):
        classify_heads(fv_model(), kinds=["function-vector"], options={"icl_prompts": [1, 2]}, progress=False)


# --- name movers ----------------------------------------------------------------------------------------------
def test_name_movers_are_found_and_no_other_head():
    prompts = ioi_like_prompts(8)
    report = classify_heads(name_mover_model(), kinds=["name-mover"], options={"ioi_prompts": prompts},
                            bootstrap=200, progress=False)
    assert report.as_dict() == {(0, 0): {"name-mover"}, (0, 1): {"negative-name-mover"}}
    d = report.details["name-mover"].set_index("head")
    assert d.attention_to_io[0] > 0.99 and d.attention_to_io[3] > 0.99 and d.attention_to_io[2] < 0.01
    assert d.copying[0] == 1.0 and d.negative_copying[1] == 1.0 and d.copying[2] == 1.0
    assert d.copying[3] == 0.0 and d.negative_copying[3] == 0.0  # writes nothing: no rank either way
    assert set(head_kinds()["name-mover"].labels) == {"name-mover", "negative-name-mover"}
    legend = {t.name: t.marker.color for t in report.figure().data if t.type == "scatter" and t.name}
    assert legend["name-mover"] == head_kinds()["name-mover"].colour != legend["negative-name-mover"]


def test_copying_scores_against_a_naive_rank():
    torch.manual_seed(0)
    model = Transformer(ModelConfig(n_layers=1, d_model=16, n_heads=2, d_vocab=12, n_ctx=8, attn_only=True,
                                    normalization="none", positional="rotary", attn_bias=False,
                                    out_bias=False)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_()
    names = torch.tensor([3, 7])
    pos, neg = name_copying_scores(model, names, comparisons=100)  # the whole vocabulary of 12
    a = model.blocks[0].attn
    W_V = a.W_qkv.weight[2 * 2 * 8:].T.reshape(16, 2, 8)  # [M, H, D]
    W_O = a.W_O.weight.T.reshape(2, 8, 16)  # [H, D, M]
    for h in range(2):
        for i, t in enumerate(names.tolist()):
            logits = model.embed.weight[t] @ W_V[:, h] @ W_O[h] @ model.unembed.weight.T  # [V]
            others = torch.cat([logits[:t], logits[t + 1:]])
            assert float(pos[0, h, i]) == pytest.approx(float((others < logits[t]).float().mean()), abs=1e-6)
            assert float(neg[0, h, i]) == pytest.approx(float((others > logits[t]).float().mean()), abs=1e-6)


def test_name_mover_logit_difference_and_bad_input():
    model, prompts = name_mover_model(), ioi_like_prompts(4)
    per = kind_metric(model, "name-mover", prompts.clean, answers=prompts.answers)
    # At END: +IO (L0H0) - IO (L0H1) + S (L0H2, which attends to S): IO - S = 0 - 1.
    assert torch.allclose(per([]), torch.full((4,), -1.0, dtype=torch.float64), atol=1e-4)
    # Per-position mean ablation of L0H2: at END it writes the mean one-hot of the prompts' subjects.
    io, s = prompts.answers[:, 0], prompts.answers[:, 1]
    share = (s[:, None, None] == torch.stack([io, s], 1)[None]).double().mean(0)  # [N, 2]: subjects equal to IO_j / S_j
    per_pos = kind_metric(model, "name-mover", prompts.clean, answers=prompts.answers, reference=prompts.clean,
                          per_position=True)
    assert torch.allclose(per_pos([(0, 2)]), share[:, 0] - share[:, 1], atol=1e-4)
    with pytest.raises(ValueError, match=r"answers= \[N, 2\] \(IO, S\) ids, got \(4,\)"):
        kind_metric(model, "name-mover", prompts.clean, answers=prompts.answers[:, 0])
    twice = TaskPrompts("ioi", torch.tensor([[0, 5, 6, 5, 9]]), torch.tensor([[0, 1, 2, 3, 9]]),
                        answers=torch.tensor([[5, 6]]))
    with pytest.raises(ValueError, match="IOI prompt 0: the indirect object token 5 occurs 2 times"):
        io_positions(twice)
