# Not a module of the benchmark suite: the script that recorded the files beside it (the checkpoint paths in them
# are where the runs were when it ran).
"""Per-forward seconds as generate measures them, for K=4 fixed and auto, interleaved per prompt."""
import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))      # the checkout's root, for benchmarks
from benchmarks.draft_replay import _load
from mutor.generation import DraftPolicy, FixedDraft, generate


def logged(policy, log):
    told = policy.record
    def record(rows, seconds, prompt=False, tokens=1):
        log.append((rows, seconds))
        told(rows, seconds, prompt, tokens)
    policy.record = record
    return policy

ap = argparse.ArgumentParser()
ap.add_argument("checkpoint")
ap.add_argument("--dtype")
ap.add_argument("--out")
ap.add_argument("--task", default="reasoning_gym")
ap.add_argument("--limit", type=int, default=50)
a = ap.parse_args()
ns = argparse.Namespace(checkpoint=a.checkpoint, dtype=a.dtype, task=a.task, split="validation", data=None,
                        limit=a.limit, max_new_tokens=None)
with torch.no_grad():
    model, tok, prompts, n_new, mode = _load(ns)
    logs = {"K=4": [], "auto": [], "K=1": []}
    ch = {"K=4": logged(FixedDraft(4), logs["K=4"]), "auto": logged(DraftPolicy(4), logs["auto"]),
          "K=1": logged(FixedDraft(1), logs["K=1"])}
    names = list(ch)
    for i, p in enumerate(prompts):
        for n in names[i % 3:] + names[:i % 3]:
            generate(model, torch.tensor([p]), n_new, ch[n], eos_token_id=tok.eos_token_id, prefix_attention=mode)
json.dump(logs, open(a.out, "w"))
