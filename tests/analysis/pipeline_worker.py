"""One rank of the pipeline tests (tests/analysis/test_pipeline.py starts 2 or 4 of these).

Usage: python pipeline_worker.py RANK WORLD PORT OUT_DIR CASE[,CASE...] CHECKPOINT
Each case writes OUT_DIR/{case}.rank{R}.pkl: what rank 0 got (logits, trace, reducers) and what this rank held
and ran (materialised blocks, hooks fired).
"""

import os
import pickle
import sys
import time
from pathlib import Path

import torch

torch.set_num_threads(1)  # several ranks share two cores

MICRO_BATCHES = 3


def tokens():
    """The batch every case runs (rank 0's copy is the one used; the others pass None)."""
    return torch.randint(0, 50, (7, 9), generator=torch.Generator().manual_seed(3))  # 7 rows: micro-batches 3, 2, 2


def padding_mask():
    """Rows 1 and 6 padded (in different micro-batches): the mask travels from rank 0 to every rank."""
    mask = torch.ones(7, 9, dtype=torch.long)
    mask[1, :3] = mask[6, :5] = 0  # left padding: the real tokens attend to fewer keys
    return mask


def ablate_head(z, hook):
    """Zero head 1 of layer 2's z: a hook whose effect shows in the logits."""
    z[:, :, 1] = 0.0
    return z


def reducers():
    from interp.streaming import MeanReducer

    return [MeanReducer("*hook_pattern"), MeanReducer(["blocks.0.hook_resid_post", "blocks.3.mlp.hook_post"])]


#: classify_heads' settings in the classify case: low thresholds, so that the random model's heads get rows of
#: every kind; the positional data is two batches (the second padded), the induction data three (the last of 2 rows).
CLASSIFY = dict(kinds=["positional", "previous-token", "duplicate-token", "induction", "sink"], window=2,
                positional_threshold=0.2, previous_token_threshold=0.05, duplicate_token_threshold=0.02,
                induction_threshold=0.02, copying_threshold=0.0, n_seqs=6, half_len=5, batch_size=4,
                options={"sink_threshold": 0.1, "sink_value_ratio": 2.0})


def weight_kinds_settings() -> dict:
    """classify_heads' settings of the OV-circuit kinds (copy suppression, successor, name movers): the random
    model's heads get rows of every kind at these thresholds; the IOI prompts (every token once a row, so the
    indirect object occurs once) run through the pipeline, the ordinal sequences are read from the weights."""
    gen = torch.Generator().manual_seed(7)
    clean = torch.stack([torch.randperm(50, generator=gen)[:9] for _ in range(6)])  # [6, 9]: distinct ids a row
    corrupted = torch.stack([torch.randperm(50, generator=gen)[:9] for _ in range(6)])
    from interp.data.circuit_tasks import TaskPrompts

    ioi = TaskPrompts("ioi", clean, corrupted, answers=clean[:, [2, 4]])  # (IO, S) at positions 2 and 4
    return dict(kinds=["copy-suppression", "successor", "name-mover"], batch_size=4,
                options={"copy_suppression_threshold": 0.55, "copy_suppression_tokens": 40,
                         "copy_suppression_comparisons": 30, "successor_threshold": 0.1,
                         "ordinal_tokens": {"low": list(range(3, 13)), "high": list(range(30, 41))},
                         "ioi_prompts": ioi, "name_mover_threshold": 0.05, "name_mover_copying": 0.57,
                         "name_mover_comparisons": 20})


def function_vector_settings() -> dict:
    """classify_heads' settings of the function-vector kind: two tasks' ICL prompts (3 shots, 8 tokens) whose
    patched decoding steps run over the pipeline; the threshold lets the random model's best heads through."""
    from interp.data.icl import icl_prompts

    prompts = icl_prompts({"succ": [(i, i + 1) for i in range(2, 20)], "pred": [(i, i - 7) for i in range(27, 45)]},
                          4, 3, bos_id=0, seed=1)
    return dict(kinds=["function-vector"], options={"icl_prompts": prompts, "function_vector_threshold": 0.0001})


def classify_data():
    """The positional data: a list of ``(tokens, mask)`` batches (rank 0's is the one run)."""
    return [(tokens()[:4], None), (tokens()[4:], padding_mask()[4:])]


def report_of(report) -> dict:
    """A HeadReport as plain values (it pickles, and the test compares it field by field)."""
    return {"df": report.df, "details": report.details, "thresholds": report.thresholds, "probes": report.probes,
            "kinds_run": report.kinds_run, "layer_heads": report.layer_heads, "n_heads": report.n_heads,
            "n_layers": report.n_layers}


def treebank_settings(conllu: str) -> dict:
    """classify_heads over a treebank: its sentences are the positional data too (annotations travel)."""
    return dict(conllu=conllu, kinds=["positional", "syntactic", "induction"], max_sentences=12, batch_size=4,
                n_seqs=4, syntactic_min_count=1)


def every_position_metric(logits):
    """A metric that reads every position (the patched runs then unembed them all, and a pass resumed at a
    position takes the base run's logits before it)."""
    return logits[:, :, 3].mean() - logits[:, :, 7].mean()


def nan_metric(logits):
    return logits.sum() * float("nan")


def patching_inputs():
    """``(clean, corrupted, answers, mask)``: 4 rows of 9 tokens (two micro-batches of 2 rows)."""
    gen = torch.Generator().manual_seed(5)
    clean = torch.randint(0, 50, (4, 9), generator=gen)
    corrupted = torch.randint(0, 50, (4, 9), generator=gen)
    answers = torch.randint(0, 50, (4, 2), generator=gen)
    mask = torch.ones(4, 9, dtype=torch.long)
    mask[2, :3] = 0  # left padding in one row
    return clean, corrupted, answers, mask


def patching_settings():
    """The activation_patching calls compared with one process: per-head and per-layer sites, whole and per
    position (a causal model's passes then resume at a position from the base run's cache), both directions, a
    padding mask, and a metric of the last position or of every position."""
    clean, corrupted, answers, mask = patching_inputs()
    return {
        "z_head": dict(act="z", by="head", answer_tokens=answers, batch_size=12),
        "result_head_pos": dict(act="result", by="head_pos", metric=every_position_metric, direction="denoising",
                                batch_size=16),
        "resid_pre_layer_pos": dict(act="resid_pre", by="layer_pos", answer_tokens=answers, batch_size=12,
                                    attention_mask=mask),
        "attn_out_layer": dict(act="attn_out", by="layer", metric=every_position_metric, batch_size=8),
    }


def run(case: str, rank: int, world: int, path: str):
    from interp import distributed
    from interp.pipeline import Pipeline
    from interp.zoo.checkpoint import load_checkpoint_stage

    stage = load_checkpoint_stage(path)
    held = sorted({int(n.split(".")[1]) for n, p in stage.named_parameters() if n.startswith("blocks.")
                   and not p.is_meta})
    pipe = Pipeline(stage, micro_batches=MICRO_BATCHES)
    mine = tokens() if rank == 0 else None
    if case == "equal":
        fired: list[str] = []
        logits = pipe(mine)
        padded = pipe(mine, attention_mask=padding_mask() if rank == 0 else None)
        ablated = pipe(mine, fwd_hooks=[("blocks.2.attn.hook_z", ablate_head),
                                        ("*hook_resid_pre", lambda x, hook: fired.append(hook.name))])
        out, trace = pipe.run_with_cache(mine, reducers=reducers())
        streamed = reducers()
        n = pipe.stream([(tokens()[:4], None), (tokens()[4:], padding_mask()[4:])], streamed)
        return {"logits": logits, "padded": padded, "ablated": ablated, "fired": fired, "held": held,
                "embed_meta": stage.embed.weight.is_meta, "trace_logits": out,
                "trace": None if trace is None else {k: trace[k] for k in trace.keys()},
                "meta": None if trace is None else trace.meta,
                "stats": None if trace is None else trace.stats, "streamed_n": n,
                "streamed": [r.result() for r in streamed] if rank == 0 else None}
    if case == "classify":
        from interp.analysis import classify_heads
        from interp.streaming import MeanReducer

        report = classify_heads(pipe, tokens=classify_data() if rank == 0 else [], **CLASSIFY)
        boot = classify_heads(pipe, tokens=classify_data(), bootstrap=20, **{**CLASSIFY, "kinds": ["induction", "sink"]})
        chunked = MeanReducer("*hook_pattern")  # fed on the owner ranks, three query chunks of a 9-token batch
        n = pipe.feed(tokens(), [chunked], batch_size=4, query_chunk=4)
        weights = classify_heads(pipe, **weight_kinds_settings())  # the OV-circuit kinds: lent embeddings, W_U
        fv = classify_heads(pipe, **function_vector_settings())  # patched decoding steps over the ranks
        return {"report": report_of(report), "bootstrap": report_of(boot), "chunked_n": n,
                "chunked": chunked.state_dict(), "held": held, "weights": report_of(weights),
                "function_vector": report_of(fv),
                "embed_meta": stage.embed.weight.is_meta, "unembed_meta": stage.unembed.weight.is_meta}
    if case == "classify_treebank":  # a text model's checkpoint (its tokenizer stored) and a CoNLL-U treebank
        from interp.analysis import classify_heads

        report = classify_heads(pipe, **treebank_settings(os.environ["PIPELINE_CONLLU"]))
        return {"report": report_of(report)}
    if case == "patching":
        from interp.analysis import activation_patching

        clean, corrupted, _, _ = patching_inputs()
        tables = {name: activation_patching(pipe, clean, corrupted, **kw) for name, kw in patching_settings().items()}
        try:
            activation_patching(pipe, clean, corrupted, act="z", metric=nan_metric)
            error = None
        except ValueError as e:  # raised on the last rank, and from it on every other
            error = str(e)
        return {"tables": tables, "error": error}
    if case == "die":
        victim = world - 1

        def die(x, hook):
            if calls.append(1) or len(calls) == 2:  # the second micro-batch: the run is under way
                os._exit(7)

        calls: list[int] = []
        t0 = time.monotonic()
        try:
            pipe(mine, fwd_hooks=[(f"blocks.{stage.cfg.n_layers - 1}.hook_resid_pre", die)] if rank == victim else [])
        except distributed.DistributedError as e:
            return {"error": str(e), "seconds": time.monotonic() - t0}
        return {"error": None, "seconds": time.monotonic() - t0}
    raise ValueError(f"unknown case {case!r}")


def main() -> None:
    rank, world, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], Path(sys.argv[4])
    cases, path = sys.argv[5].split(","), sys.argv[6]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    from interp import distributed

    assert distributed.init_from_env(timeout_s=float(os.environ.get("INTERP_DIST_TIMEOUT", "60")))
    for case in cases:
        result = run(case, rank, world, path)
        with open(out / f"{case}.rank{rank}.pkl", "wb") as f:
            pickle.dump(result, f)
    if "die" in cases:  # a peer is gone: leave as the CLI does after a DistributedError
        distributed.exit_after_failure(0)
    distributed.shutdown()


if __name__ == "__main__":
    main()
