# Not a module of the benchmark suite: the script that recorded the files beside it (paths are this machine's).
"""Per-forward seconds as generate measures them, for K=4 fixed and auto, interleaved per prompt."""
import json, sys, argparse
import torch
sys.path.insert(0, "/work/main")
from benchmarks.draft_replay import _load
from mutor.integrations.draft_choice import DraftLength
from mutor.integrations.speculative import generate

class Rec(DraftLength):
    def __init__(self, *a, log=None, **kw):
        super().__init__(*a, **kw); self.log = log
    def record(self, rows, seconds):
        self.log.append((rows, seconds)); super().record(rows, seconds)

ap = argparse.ArgumentParser(); ap.add_argument("checkpoint"); ap.add_argument("--dtype"); ap.add_argument("--out")
ap.add_argument("--task", default="reasoning_gym"); ap.add_argument("--limit", type=int, default=50)
a = ap.parse_args()
ns = argparse.Namespace(checkpoint=a.checkpoint, dtype=a.dtype, task=a.task, split="validation", data=None, limit=a.limit, max_new_tokens=None)
with torch.no_grad():
    model, tok, prompts, n_new, mode = _load(ns)
    logs = {"K=4": [], "auto": [], "K=1": []}
    ch = {"K=4": Rec(4, fixed=4, log=logs["K=4"]), "auto": Rec(4, log=logs["auto"]), "K=1": Rec(4, fixed=1, log=logs["K=1"])}
    names = list(ch)
    for i, p in enumerate(prompts):
        for n in names[i % 3:] + names[:i % 3]:
            generate(model, torch.tensor([p]), n_new, ch[n], eos_token_id=tok.eos_token_id, prefix_attention=mode)
json.dump(logs, open(a.out, "w"))
