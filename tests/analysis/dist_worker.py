"""One rank of the distributed tests (tests/analysis/test_distributed.py starts 2 or 3 of these).

Usage: python dist_worker.py RANK WORLD PORT OUT_DIR CASE[,CASE...] [CONLLU]
Each case writes OUT_DIR/{case}.rank{R}.pkl (results, or the error message it was expected to raise).
"""

import os
import pickle
import sys
from pathlib import Path

import torch

torch.set_num_threads(1)  # several ranks share two cores


def data_for(model, world: int):
    """The same data on every rank; sizes chosen so that shards are uneven (2 ranks) or one is empty (3)."""
    from interp.data import random_tokens_for, repeated_tokens_for

    tokens = random_tokens_for(model, 20, 12, seed=1)  # 3 batches of 8, 8, 4 rows
    ind = repeated_tokens_for(model, 12, 6, seed=2)  # 2 batches of 8, 4: rank 2 of 3 has none
    return tokens, ind


def importance_batches(model, world: int):
    from interp.data import repeated_sequences

    n = 3 if world == 2 else 2  # 2 ranks: shards of 2 and 1 batches; 3 ranks: the last shard is empty
    return [repeated_sequences(4, 6, model.cfg.d_vocab, seed=s) for s in range(n)]


def run(case: str, rank: int, world: int, conllu: str | None):
    from interp import distributed
    from interp.analysis import classify_heads
    from interp.pruning import LanguageModelObjective, head_importance
    from interp.streaming import MeanReducer, stream
    from interp.zoo import load

    if case == "classify_induction":
        model = load("induction-2l")
        tokens, ind = data_for(model, world)
        r = classify_heads(model, tokens=tokens, induction_tokens=ind, batch_size=8)
        return {"df": r.df, "details": r.details}
    if case == "classify_treebank":
        model = load("minilm-l6")
        r = classify_heads(model, conllu=conllu, max_sentences=16, batch_size=8, n_seqs=12, syntactic_min_count=1)
        return {"df": r.df, "details": r.details}
    if case == "importance":
        model = load("induction-2l")
        batches = importance_batches(model, world)
        obj = LanguageModelObjective()
        return {"raw": head_importance(model, batches, obj, normalize_layers=False),
                "normalized": head_importance(model, batches, obj)}
    if case == "mismatch":
        model = load("induction-2l")
        out = {}
        tokens = torch.randint(0, model.cfg.d_vocab, (6, 10), generator=torch.Generator().manual_seed(int(rank == 1)))
        try:
            stream(model, tokens, [MeanReducer("blocks.0.attn.hook_pattern")])
        except ValueError as e:
            out["data"] = str(e)
        with torch.no_grad():
            next(model.parameters())[0].add_(1e-3 if rank == 1 else 0.0)
        try:
            head_importance(model, importance_batches(model, 2), LanguageModelObjective())
        except ValueError as e:
            out["weights"] = str(e)
        return out
    if case == "die":
        if rank == 1:
            os._exit(7)  # a rank that dies before the first collective
        model = load("induction-2l")
        try:
            stream(model, torch.zeros(4, 8, dtype=torch.long), [MeanReducer("blocks.0.attn.hook_pattern")])
        except distributed.DistributedError as e:
            return {"error": str(e)}
        return {"error": None}
    raise ValueError(f"unknown case {case!r}")


def main() -> None:
    rank, world, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], Path(sys.argv[4])
    cases, conllu = sys.argv[5].split(","), (sys.argv[6] if len(sys.argv) > 6 else None)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    from interp import distributed

    assert distributed.init_from_env(timeout_s=float(os.environ.get("INTERP_DIST_TIMEOUT", "60")))
    for case in cases:
        result = run(case, rank, world, conllu)
        with open(out / f"{case}.rank{rank}.pkl", "wb") as f:
            pickle.dump(result, f)
    if "die" in cases:  # rank 0's peer is gone: leave as the CLI does after a DistributedError
        distributed.exit_after_failure(0)
    distributed.shutdown()


if __name__ == "__main__":
    main()
