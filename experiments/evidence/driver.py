"""Runs the evidence plan (plan.yaml): what is missing, in order, resumable at any point.

Each declared run goes through one pipeline, every stage of which is skipped when its output exists:

1. ``mutor train`` the group's recipe for the run's method and seed, into ``runs_dir/<group>/<run>``,
   checkpointing every ``save_every`` steps. A directory with a checkpoint is resumed (``--resume``: the
   same batches, RNG and optimizer state as an uninterrupted run); one killed before its first checkpoint
   is started again. Every training process's CPU seconds and peak memory go to ``<run>.train.jsonl``
   beside the directory (a resumed run has several).
2. Checkpoints that are not at an epoch's end are deleted (they only served resuming).
3. ``mutor eval --checkpoints``: the task's protocol picks the checkpoint (gsm_symbolic: validation exact
   match), then scores it on every test split. A synthetic task (``eval: {task: run}``: star graphs) scores
   the final model on its run's own held-out data instead, one record per example, and keeps the
   evaluations logged during training as the run's curve.
4. Held-out answer loss of the final model (``experiments/real/heldout_loss.py``), when the group asks.
5. One JSON row, with per-example scores so that report.py can pair runs and the resolved recipe the run was
   trained with (``resolved_recipe``: the plan's overrides applied to the group's recipe, as ``mutor train``
   recorded it), appended to ``results``, and the scored generations gzipped beside it
   (``generations/<group>/<run>/<split>.jsonl.gz``). Nothing is committed to git unless ``--commit`` is given;
   with it, each row is committed with its generations, and nothing else.
6. For a MuToR run, when the plan has a ``drafting`` block: its registers as drafters on the selected
   checkpoint (``drafting.py``: acceptance per offset, tokens/s against greedy decoding at batch size 1),
   one row in ``drafting.jsonl`` beside the results file. A run whose main row exists but whose drafting
   row does not is taken up again for this stage alone while its checkpoints are on disk. ``--redraft`` measures
   the finished runs again (new drafting code, a quiet machine); ``--redraft --retrain`` first trains again those
   whose checkpoints are gone, and checks that the training reproduced the row's (its final training loss); the
   run directory keeps that check (``retrained.json``), so every later drafting row of those weights records it.
7. For a MuToR run of a star-graph group (``eval: {task: run}``), when the plan has a ``first_hop`` block: the
   registers' own predictions of the first hop, teacher-forced on the held-out graphs (``first_hop.py``), one
   row in ``first_hop.jsonl``; owed rows are taken up again like drafting rows. A group with
   ``keep_checkpoints: true`` keeps every checkpoint (a model from scratch of a few MB) and its row holds the
   same over them (``--curve``: the registers' accuracy on the first hop over training, and the hop's share of
   the objective).

A run whose row is already in ``results`` is skipped (only a stage it still owes is taken up again), so the
driver can be started any number of times; to train and score a committed row again, use ``reproduce.py``,
which runs these same stages into a scratch directory. ``--results`` and ``--runs-dir`` replace the plan's
results file and run directory. A group with a ``stopped`` key (its own rule ended it, e.g. a pilot outside its
band) trains no further run; its rows stand. A group named in the plan's ``as_trained`` block trains with the
values listed there before its own overrides: what its recipe said when it trained, where the recipe has changed
since. A run is claimed by a lock file holding the driver's pid, so two drivers never train the same run; a lock
whose process is gone is taken over. Stop the driver with Ctrl-C or ``kill PID``: it stops its children, and the
next start resumes from the last checkpoint.

    nohup python experiments/evidence/driver.py --slots 2 --threads 1 > runs/evidence.log 2>&1 &
    python experiments/evidence/driver.py --list          # the plan and what is done
"""

from __future__ import annotations

import argparse
import fnmatch
import gzip
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from report import generations_path, load  # same folder: where a row's generations are kept, the rows

from mutor.run.train import last_checkpoint
from mutor.utils.devices import cpu_description
from mutor.utils.errors import MutorUserError
from mutor.utils.io import yaml_load

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
# `python -m mutor` of this interpreter, not the `mutor` on PATH: a driver started from a frozen worktree
# (start.sh) runs the package on its PYTHONPATH, whatever console script the shared venv was installed with
MUTOR = (sys.executable, "-m", "mutor")
RETRAINED = "retrained.json"           # in a run directory trained again by --redraft --retrain: what its rows record


@dataclass
class Run:
    group: dict = field(repr=False)
    method: str
    seed: int
    epochs: int
    tag: str = ""
    overrides: list = field(default_factory=list)      # after the group's (e.g. a pilot's task choice)

    @property
    def name(self) -> str:
        return f"{self.method}_s{self.seed}" + (f"_{self.tag}" if self.tag else "")

    @property
    def key(self) -> tuple[str, str]:
        return self.group["name"], self.name

    @property
    def identity(self) -> dict:
        """The fields that open each side row (drafting, first hop)."""
        return {"group": self.group["name"], "run": self.name, "method": self.method, "seed": self.seed,
                "tag": self.tag}

    @property
    def steps(self) -> int:
        return self.epochs * self.group["steps_per_epoch"]


def keeps(group: dict) -> bool:
    """Whether a group keeps every checkpoint (``keep_checkpoints: true``): a star-graph group from scratch whose
    first-hop row is a curve over them (``first_hop.py --curve``)."""
    return bool(group.get("keep_checkpoints"))


def as_trained(plan: dict, path: Path) -> dict[str, list[str]]:
    """Group name -> the overrides the plan's ``as_trained`` block puts before the group's own: the values a recipe
    had when those groups trained on it, where the recipe has changed since. Each entry names its recipe, its
    overrides and its groups; a group it names must exist and train on that recipe."""
    groups = {g.get("name"): g for g in plan.get("groups") or []}
    out: dict[str, list[str]] = {}
    for entry in plan.get("as_trained") or []:
        for missing in {"recipe", "overrides", "groups"} - set(entry):
            raise SystemExit(f"{path}: an as_trained entry has no {missing!r}")
        for name in entry["groups"]:
            if name not in groups:
                raise SystemExit(f"{path}: as_trained names group {name!r}, which the plan does not declare")
            if groups[name].get("recipe") != entry["recipe"]:
                raise SystemExit(f"{path}: as_trained pins {entry['recipe']!r} for group {name!r}, which trains on "
                                 f"{groups[name].get('recipe')!r}")
            out[name] = [*out.get(name, []), *entry["overrides"]]
    return out


def load_plan(path: Path) -> tuple[dict, list[Run]]:
    """The plan and its runs in order. A group's ``overrides`` come back with the plan's ``as_trained`` values for
    it first (:func:`as_trained`), so that everything that trains or resolves a group does so as it trained."""
    try:
        plan = yaml_load(path.read_text(), str(path))
    except MutorUserError as err:
        raise SystemExit(str(err)) from None
    pinned = as_trained(plan, path)
    runs, seen = [], set()
    for g in plan["groups"]:
        for missing in {"name", "recipe", "epochs", "steps_per_epoch", "runs", "eval"} - set(g):
            raise SystemExit(f"{path}: group {g.get('name', '?')!r} has no {missing!r}")
        if g["name"] in pinned:                   # a new list: groups merged from one anchor share theirs
            g["overrides"] = [*pinned[g["name"]], *g.get("overrides", [])]
        for r in g["runs"]:
            run = Run(g, r["method"], int(r["seed"]), int(r.get("epochs", g["epochs"])), r.get("tag", ""),
                      list(r.get("overrides", [])))
            if run.key in seen:
                raise SystemExit(f"{path}: run {run.key} is declared twice")
            seen.add(run.key)
            runs.append(run)
    return plan, runs


def done_keys(results: Path) -> set:
    if not results.is_file():
        return set()
    return {(r["group"], r["run"]) for r in map(json.loads, filter(str.strip, results.read_text().splitlines()))}


# ----------------------------------------------------------------------------- claiming a run
def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def claim(lock: Path) -> bool:
    """Create ``lock`` holding this pid; take over a lock whose process is gone."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            try:
                pid = int(lock.read_text().strip() or 0)
            except (OSError, ValueError):
                pid = 0
            if pid and _alive(pid):
                return False
            lock.unlink(missing_ok=True)
            continue
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        return True
    return False


def _evaluated(out: Path, task: str) -> bool:
    """Whether ``mutor eval --checkpoints`` finished: its summary, with every further test split of the task."""
    from mutor.eval.harness import get_benchmark

    f = out / "summary.json"
    if not f.is_file():
        return False
    return set(get_benchmark(task).test_splits[1:]) <= set(json.loads(f.read_text()).get("other_splits", {}))


def _finished(d: Path) -> bool:
    """Whether the run directory holds a finished training (its summary says so), not a killed one's remains."""
    summary = d / "summary.json"
    return summary.is_file() and bool(json.loads(summary.read_text()).get("finished"))


def _head() -> str:
    """The short commit of the code this driver runs (recorded in every row it writes)."""
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                          capture_output=True, text=True).stdout.strip()


MACHINE_PACKAGES = ("torch", "transformers", "peft", "accelerate")      # what decides a training step's arithmetic


def machine() -> dict:
    """Where a row trained (recorded in every row it writes): the CPU's model name and the bf16 instruction sets
    it has (with AMX or without, the bf16 kernels may differ, hence the summation order), Python's and the
    packages' versions. A row trained again elsewhere is compared with these in mind (``reproduce.py``)."""
    from importlib.metadata import PackageNotFoundError, version

    cpu, flags = cpu_description()
    versions = {}
    for name in MACHINE_PACKAGES:
        try:
            versions[name] = version(name)
        except PackageNotFoundError:
            versions[name] = None
    return {"cpu": cpu, "bf16_isa": sorted(flags & {"avx512_bf16", "amx_bf16"}),
            "python": platform.python_version(), **versions}


def train_ntp_loss_last(summary: dict, run: Run) -> Optional[float]:
    """The mean next-token training loss over the last fifth of an epoch (a row's ``train_ntp_loss_last``): also
    the check that a run trained again (``--redraft --retrain``) reproduced the one its row describes."""
    step, span = summary["global_step"], max(1, run.group["steps_per_epoch"] // 5)
    last = [h.get("ntp_loss", h.get("loss")) for h in summary["train_history"]
            if ("ntp_loss" in h or "loss" in h) and h["step"] > step - span]
    return round(sum(last) / len(last), 4) if last else None


def resolved_recipe(d: Path) -> Optional[dict]:
    """The recipe a run was trained with, as ``mutor train`` recorded it in the run directory (the group's
    recipe with the plan's overrides applied), without what depends only on where it ran (the recipe file's
    folder, the output directory). None when the directory has no recorded recipe."""
    f = d / "recipe.yaml"
    if not f.is_file():
        return None
    recipe = yaml_load(f.read_text(), str(f))
    recipe.pop("source_dir", None)
    (recipe.get("training") or {}).pop("output_dir", None)
    return recipe


# ----------------------------------------------------------------------------- stages
class Driver:
    def __init__(self, plan: dict, args: argparse.Namespace):
        self.plan, self.args = plan, args
        runs_dir = Path(plan["runs_dir"])
        self.runs_dir = runs_dir if runs_dir.is_absolute() else REPO / plan["runs_dir"]
        if args.runs_dir:
            self.runs_dir = Path(args.runs_dir)
        self.results = Path(args.results or REPO / plan["results"])
        self.drafting_results = self.results.with_name("drafting.jsonl")   # beside the results file
        self.first_hop_results = self.results.with_name("first_hop.jsonl")
        self.children: set[subprocess.Popen] = set()
        self.lock = threading.Lock()
        self.stopping = False

    def log(self, run: Run, msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {run.group['name']}/{run.name}: {msg}", flush=True)

    def sh(self, cmd: list[str], log: Path, threads: int) -> dict:
        """Run ``cmd`` (output appended to ``log``); its exit code, wall and CPU seconds and peak RSS."""
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1"}
        t0 = time.time()
        with open(log, "a") as out:
            out.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(cmd)}\n")
            out.flush()
            p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO)
            with self.lock:
                self.children.add(p)
            _, status, usage = os.wait4(p.pid, 0)
            p.returncode = os.waitstatus_to_exitcode(status)
            with self.lock:
                self.children.discard(p)
        return {"rc": p.returncode, "wall_seconds": round(time.time() - t0, 1),
                "cpu_seconds": round(usage.ru_utime + usage.ru_stime, 1),
                "peak_rss_gb": round(usage.ru_maxrss / 2**20, 2)}


    def stage(self, run: Run, d: Path, what: str, cmd: list, ledger: Optional[dict] = None,
              threads: Optional[int] = None) -> dict:
        """Log ``what``, run ``cmd`` into the run's log (:meth:`sh`) and raise when it fails, naming the program
        and the log. ``ledger``: fields of a line appended to the run's ``.train.jsonl`` with the resources
        used, failed or not (training's record of CPU time)."""
        self.log(run, what)
        log = d.parent / f"{run.name}.log"
        res = self.sh([str(c) for c in cmd], log, threads or self.args.threads)
        if ledger is not None:
            with open(d.parent / f"{run.name}.train.jsonl", "a") as f:
                f.write(json.dumps({"time": time.strftime("%Y-%m-%d %H:%M:%S"), **ledger, **res}) + "\n")
        if res["rc"] != 0:
            prog = f"mutor {cmd[3]}" if tuple(cmd[:3]) == MUTOR else Path(cmd[1]).name
            raise RuntimeError(f"{prog} exited {res['rc']} (log: {log})")
        return res

    def train(self, run: Run, d: Path, threads: Optional[int] = None) -> None:
        if _finished(d):
            return
        has_ck = d.is_dir() and last_checkpoint(d) is not None    # complete ones only (mutor.run.train)
        if d.exists() and not has_ck:
            shutil.rmtree(d)                     # killed before its first complete checkpoint: nothing to resume
        g, t = run.group, threads or self.args.threads
        cmd = [*MUTOR, "train", g["recipe"], f"method=[{run.method}]", f"seed={run.seed}", f"threads={t}",
               *g.get("overrides", []), *run.overrides, f"training.max_steps={run.steps}",
               f"training.save_steps={g.get('save_every', g['steps_per_epoch'])}",
               # every epoch's end is a candidate for selection; a synthetic task scores the final model only, so
               # only the newest checkpoint (for resuming) is kept (a full fine-tune's is 1.6 GB), unless the group
               # keeps them for the first-hop curve (keep_checkpoints: a model from scratch of a few MB)
               f"training.save_total_limit={1 if g['eval']['task'] == 'run' and not keeps(g) else 'null'}",
               f"training.output_dir={d}"] + (["--resume"] if has_ck else [])
        self.stage(run, d, ("resuming" if has_ck else "training") + f" for {run.steps} steps", cmd,
                   {"resumed": has_ck}, t)

    def prune(self, run: Run, d: Path) -> None:
        if keeps(run.group):
            return
        every = run.group["steps_per_epoch"]
        for ck in d.glob("checkpoint-*"):
            if re.fullmatch(r"checkpoint-\d+", ck.name) and int(ck.name.split("-")[1]) % every:
                shutil.rmtree(ck)

    def evaluate(self, run: Run, d: Path) -> dict:
        e = run.group["eval"]
        if e["task"] == "run":
            return self.evaluate_final(run, d)
        out = d / "eval" / e["task"]
        if not _evaluated(out, e["task"]):
            cmd = [*MUTOR, "eval", "--task", e["task"], "--checkpoints", str(d), "--output-dir", str(out),
                   "--batch-size", str(e.get("batch_size", 8)), "--quiet"]
            cmd += ["--limit", str(e["limit"])] if e.get("limit") else []
            cmd += ["--max-new-tokens", str(e["max_new_tokens"])] if e.get("max_new_tokens") else []
            cmd += ["--data", str(REPO / e["data"])] if e.get("data") else []
            cmd += ["--dtype", e["dtype"]] if e.get("dtype") else []
            res = self.stage(run, d, "evaluating checkpoints", cmd)
            (d / "eval_seconds.json").write_text(json.dumps(res))
        return {**json.loads((out / "summary.json").read_text()), "eval_dir": str(out)}

    def evaluate_final(self, run: Run, d: Path) -> dict:
        """A synthetic task (``eval: {task: run}``, star graphs): the final model on its run's own held-out data
        (``mutor eval --task run``, one record per example for pairing), and the evaluations logged during
        training as the run's curve (``per_checkpoint``)."""
        e, out = run.group["eval"], d / "eval" / "run"
        # the run's own held-out graphs ("test"), then each extra source (path_star: reasoning-gym's, relabelled)
        for split in ["test", *e.get("sources", [])]:
            target = out / "final" / split
            if (target / "summary.json").is_file():
                continue
            cmd = [*MUTOR, "eval", "--task", "run", "--model", str(d), "--output-dir", str(target), "--quiet"]
            cmd += ["--dtype", e["dtype"]] if e.get("dtype") else []
            cmd += ["--source", split] if split != "test" else []
            res = self.stage(run, d, "evaluating the final model" + (f" on {split}" if split != "test" else ""), cmd)
            if split == "test":
                (d / "eval_seconds.json").write_text(json.dumps(res))
        test = out / "final" / "test"
        other = {s: {"summary": str(out / "final" / s / "summary.json")} for s in e.get("sources", [])}
        curve = json.loads((d / "summary.json").read_text()).get("eval_history", [])
        return {**json.loads((test / "summary.json").read_text()), "split": "test", "selected_checkpoint": "final",
                "selection": "the final model (curve: the evaluations during training)", "per_checkpoint": curve,
                "eval_dir": str(out), "other_splits": other}

    def answer_loss(self, run: Run, d: Path) -> dict:
        n = run.group["eval"].get("answer_loss")
        if not n:
            return {}
        f = d / "answer_loss.jsonl"
        if not f.is_file() or len(f.read_text().splitlines()) < 2:
            f.unlink(missing_ok=True)
            self.stage(run, d, "held-out answer loss", [sys.executable, REPO / "experiments/real/heldout_loss.py", d,
                                                        "--limit", n, "--output", f])
        return {r["split"]: r for r in map(json.loads, f.read_text().splitlines())}

    def row(self, run: Run, d: Path, ev: dict, losses: dict) -> dict:
        s = json.loads((d / "summary.json").read_text())
        procs = [json.loads(x) for x in (d.parent / f"{run.name}.train.jsonl").read_text().splitlines()]
        out = Path(ev["eval_dir"])
        splits = {}
        for split, summ in [(ev["split"], ev)] + [(k, json.loads(Path(v["summary"]).read_text()))
                                                  for k, v in ev.get("other_splits", {}).items()]:
            gen = out / ev["selected_checkpoint"] / split / "generations.jsonl"
            per = [json.loads(x)[ev["primary"]] for x in gen.read_text().splitlines()] if gen.is_file() else None
            loss = losses.get(split, {})
            splits[split] = {"n": summ["n"], "metrics": summ["metrics"], "per_example": per,
                             "answer_loss": loss.get("answer_loss"), "answer_loss_se": loss.get("se"),
                             "answer_loss_per_example": loss.get("per_example"), "answer_tokens": loss.get("tokens")}
        commit = _head()
        return {"group": run.group["name"], "run": run.name, "method": run.method, "seed": run.seed,
                "epochs": run.epochs, "tag": run.tag, "steps": s["global_step"], "recipe": run.group["recipe"],
                "overrides": run.group.get("overrides", []) + run.overrides, "task": ev["task"],
                "selected_checkpoint": ev["selected_checkpoint"], "selection": ev["selection"],
                "per_checkpoint": ev["per_checkpoint"], "primary": ev["primary"], "splits": splits,
                "train_ntp_loss_last": train_ntp_loss_last(s, run),
                "train_cpu_seconds": round(sum(p["cpu_seconds"] for p in procs), 1),
                "train_wall_seconds": round(sum(p["wall_seconds"] for p in procs), 1),
                "train_processes": len(procs), "peak_rss_gb": max(p["peak_rss_gb"] for p in procs),
                # False when the first recorded process was itself a resume: earlier segments went unrecorded
                "train_cost_complete": not procs[0]["resumed"],
                "threads": self.args.threads, "parameters": s.get("parameters"), "precision": s.get("precision"),
                "clipping": s.get("clipping"), "resolved_recipe": resolved_recipe(d), "code": commit,
                "machine": machine(), "finished_at": time.strftime("%Y-%m-%d %H:%M:%S")}

    def drafting_spec(self, run: Run) -> Optional[dict]:
        """The drafting block that applies to ``run``: its group's own (``drafting: {limit: 100}``, or ``false``
        for none), else the plan's."""
        spec = run.group.get("drafting", self.plan.get("drafting"))
        return spec or None

    def needs_drafting(self, run: Run) -> bool:
        """A MuToR run whose drafting row is missing (the plan's ``drafting`` block)."""
        return (bool(self.drafting_spec(run)) and run.method == "mutor"
                and run.key not in done_keys(self.drafting_results))

    def drafting(self, run: Run, d: Path, ev: dict, f: Optional[Path] = None) -> Optional[dict]:
        """Registers as drafters on the selected checkpoint: ``drafting.py`` (acceptance per offset, tokens/s
        against greedy at batch size 1, on the first ``limit`` test prompts, in the evaluation's dtype)."""
        spec, e = self.drafting_spec(run), run.group["eval"]
        f = f or d / "drafting.json"
        if not f.is_file():
            ck = d if ev["selected_checkpoint"] == "final" else d / ev["selected_checkpoint"]
            cmd = [sys.executable, str(HERE / "drafting.py"), str(ck), "--task", e["task"],
                   "--limit", str(spec.get("limit", 20)), "--dtype", e.get("dtype", "float32"), "--output", str(f)]
            cmd += ["--max-new-tokens", str(e["max_new_tokens"])] if e.get("max_new_tokens") else []
            cmd += ["--data", str(REPO / e["data"])] if e.get("data") else []
            self.stage(run, d, "drafting", cmd)
        commit = _head()
        return {**run.identity, "selected_checkpoint": ev["selected_checkpoint"], **json.loads(f.read_text()),
                "code": commit, "finished_at": time.strftime("%Y-%m-%d %H:%M:%S")}

    def needs_first_hop(self, run: Run) -> bool:
        """A star-graph MuToR run whose first-hop row is missing (the plan's ``first_hop`` block)."""
        return (bool(self.plan.get("first_hop")) and run.method == "mutor" and run.group["eval"]["task"] == "run"
                and run.key not in done_keys(self.first_hop_results))

    def first_hop(self, run: Run, d: Path) -> dict:
        """``first_hop.py`` on the final model: does each register offset predict the first hop?"""
        f = d / "first_hop.json"
        if not f.is_file():
            limit = str(self.plan["first_hop"].get("limit", 500))
            cmd = [sys.executable, str(HERE / "first_hop.py"), str(d), "--limit", limit, "--output", str(f)]
            cmd += ["--curve"] if keeps(run.group) else []
            self.stage(run, d, "first hop", cmd)
        return {**run.identity, **json.loads(f.read_text()), "finished_at": time.strftime("%Y-%m-%d %H:%M:%S")}

    def owes(self, run: Run) -> bool:
        """A row of a later stage (drafting, first hop) is missing."""
        return self.needs_drafting(run) or self.needs_first_hop(run)

    def keep_generations(self, row: dict, ev: dict) -> list[Path]:
        """The scored generations of a run (its selected checkpoint, every split in its row), gzipped beside the
        results file as ``generations/<group>/<run>/<split>.jsonl.gz`` and committed with its row: the row holds
        per-example scores, these the answers themselves (what ``error_kinds.py`` reads), and they outlive the
        run directory, which a new machine does not have."""
        out, kept = Path(ev["eval_dir"]), []
        for split in row["splits"]:
            src = out / ev["selected_checkpoint"] / split / "generations.jsonl"
            if src.is_file():
                dst = generations_path(self.results, row["group"], row["run"], split)
                dst.parent.mkdir(parents=True, exist_ok=True)
                with open(src, "rb") as f, gzip.GzipFile(dst, "wb", mtime=0) as g:
                    shutil.copyfileobj(f, g)
                kept.append(dst)
        return kept

    def append(self, row: dict, results: Optional[Path] = None, extra: tuple[Path, ...] = ()) -> None:
        """Append ``row`` to ``results`` (and, with ``--commit``, commit it with the ``extra`` files)."""
        results = results or self.results
        with self.lock:
            results.parent.mkdir(parents=True, exist_ok=True)
            with open(results, "a") as f:
                f.write(json.dumps(row) + "\n")
            self.commit([results, *extra], f"Evidence: {row['group']}/{row['run']} ({results.stem} row)")

    def commit(self, paths: list[Path], message: str) -> None:
        """With ``--commit``: git-commit ``paths`` (only those) in the repository that holds them."""
        if not self.args.commit or not paths:
            return
        repo = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=paths[0].parent,
                              capture_output=True, text=True).stdout.strip()
        rel = [os.path.relpath(p, repo) for p in paths]
        subprocess.run(["git", "add", *rel], cwd=repo, check=False)
        subprocess.run(["git", "commit", "-q", "-m", message, "--", *rel], cwd=repo, check=False)

    def train_and_score(self, run: Run, d: Path) -> tuple[dict, dict]:
        """Stages 1-4 for ``run`` in ``d``, each skipped when its output exists: train (or resume), prune,
        evaluate, held-out answer loss. Returns the evaluation and the answer losses that :meth:`row` turns into
        the run's row (``reproduce.py`` calls this too, into a scratch directory)."""
        self.train(run, d)
        self.prune(run, d)
        ev = self.evaluate(run, d)
        return ev, self.answer_loss(run, d)

    def pipeline(self, run: Run) -> None:
        d = self.runs_dir / run.group["name"] / run.name
        lock = d.parent / f"{run.name}.lock"
        try:
            ev, losses = self.train_and_score(run, d)
            if not self.stopping and run.key not in done_keys(self.results):
                row = self.row(run, d, ev, losses)
                self.append(row, extra=tuple(self.keep_generations(row, ev)))
                self.log(run, "row written")
            if not self.stopping and self.needs_drafting(run):
                row = self.drafting(run, d, ev)
                if not self.stopping:
                    self.append(row, self.drafting_results)
                    self.log(run, "drafting row written")
            if not self.stopping and self.needs_first_hop(run):
                row = self.first_hop(run, d)
                if not self.stopping:
                    self.append(row, self.first_hop_results)
                    self.log(run, "first-hop row written")
        except Exception as err:                 # noqa: BLE001 - one failed run does not stop the others
            if not self.stopping:
                self.log(run, f"FAILED: {err}")
        finally:
            lock.unlink(missing_ok=True)

    def redraft(self, runs: list[Run]) -> int:
        """Drafting rows again, measured with this checkout's code, for the finished MuToR runs whose selected
        checkpoint is still on disk (after a change to the drafting code, or to measure on a quiet machine; the
        report keeps a run's latest row). With ``--retrain``, a run whose checkpoint is gone (a new machine) is
        first trained again from its plan entry: :meth:`retrain`."""
        signal.signal(signal.SIGTERM, self.stop)         # a run trained again is stopped with the driver
        signal.signal(signal.SIGINT, self.stop)
        rows = {(r["group"], r["run"]): r for r in load(self.results)}
        commit = _head()
        for run in runs:
            row, d = rows.get(run.key), self.runs_dir / run.group["name"] / run.name
            if self.stopping or run.method != "mutor" or row is None or not self.drafting_spec(run):
                continue
            ck = row["selected_checkpoint"]
            if not _finished(d) or not (d if ck == "final" else d / ck).is_dir():
                if not self.args.retrain:
                    self.log(run, f"{ck} is not on disk: not measured again (--retrain trains it again)")
                    continue
                if not self.retrain(run, d, row):
                    continue
            mark = d / RETRAINED                 # these weights were trained again, now or by an earlier --retrain
            again = json.loads(mark.read_text()) if mark.is_file() else None
            f = d / f"drafting-{commit}.json"
            f.unlink(missing_ok=True)            # measured anew: an earlier measurement's file is not reused
            out = self.drafting(run, d, {"selected_checkpoint": ck}, f)
            if not self.stopping:
                self.append({**out, **({"retrained": again} if again else {})}, self.drafting_results)
                self.log(run, f"drafting row written (code {commit})")
        return 0

    def retrain(self, run: Run, d: Path, row: dict) -> bool:
        """Train a finished run again, as its plan entry says, when its checkpoints are gone (``--redraft
        --retrain``), with the row's thread count; no results row is written. The same seed, data order and thread
        count on the same kind of CPU give the same weights: whether they did is read from the next-token training
        loss at the end, which must equal the row's (``train_ntp_loss_last``, 4 decimals); what the drafting rows record
        of it goes to the run directory's ``retrained.json`` (``reproduced`` False: the weights differ from the row's
        run, and the rows say so). Returns False when the run is claimed by another driver or training failed."""
        lock = d.parent / f"{run.name}.lock"
        d.parent.mkdir(parents=True, exist_ok=True)
        if not claim(lock):
            self.log(run, "claimed by another driver; not trained again")
            return False
        try:
            self.train(run, d, row.get("threads"))   # the row's thread count: another may sum in another order
            self.prune(run, d)
        except Exception as err:                 # noqa: BLE001 - one failed run does not stop the others
            if not self.stopping:                # a run stopped with the driver did not fail
                self.log(run, f"FAILED: {err}")
            return False
        finally:
            lock.unlink(missing_ok=True)
        loss = train_ntp_loss_last(json.loads((d / "summary.json").read_text()), run)
        same = loss == row.get("train_ntp_loss_last")
        self.log(run, f"trained again: final next-token loss {loss} against the row's {row.get('train_ntp_loss_last')}"
                      + ("" if same else " - NOT reproduced, the drafting row says so"))
        (d / RETRAINED).write_text(json.dumps({"train_ntp_loss_last": loss, "reproduced": same,
                                               "row_train_ntp_loss_last": row.get("train_ntp_loss_last")}))
        return True

    def backfill_generations(self, runs: list[Run]) -> int:
        """Keep (and with ``--commit`` commit) the scored generations of finished runs whose row has none kept
        beside the results file and whose evaluation is still on disk; train and measure nothing."""
        rows = {(r["group"], r["run"]): r for r in load(self.results)}
        for run in runs:
            row = rows.get(run.key)
            if row is None or generations_path(self.results, *run.key, "test").is_file():
                continue
            d = self.runs_dir / run.group["name"] / run.name
            task = run.group["eval"]["task"]
            ev = {"eval_dir": str(d / "eval" / task), "selected_checkpoint": row["selected_checkpoint"]}
            kept = self.keep_generations(row, ev)
            self.commit(kept, f"Evidence: {row['group']}/{row['run']} (generations)")
            self.log(run, f"generations kept: {len(kept)} split(s)" if kept else "no generations on disk")
        return 0

    def stop(self, *_) -> None:
        self.stopping = True
        with self.lock:
            for p in self.children:
                p.terminate()

    def main(self, runs: list[Run]) -> int:
        signal.signal(signal.SIGTERM, self.stop)
        signal.signal(signal.SIGINT, self.stop)
        done = done_keys(self.results)
        # a finished run still owes its drafting and first-hop rows while its checkpoints are on disk
        # a group stopped by its own rule (its `stopped` key) trains no further run
        todo = [r for r in runs if (r.key not in done and not r.group.get("stopped"))
                or (r.key in done and self.owes(r) and (self.runs_dir / r.group["name"] / r.name / "eval").is_dir())]
        active: list[threading.Thread] = []
        while todo and not self.stopping:
            active = [t for t in active if t.is_alive()]
            if len(active) >= self.args.slots:
                time.sleep(2)
                continue
            run = todo.pop(0)
            d = self.runs_dir / run.group["name"] / run.name
            if not claim(d.parent / f"{run.name}.lock"):
                self.log(run, "claimed by another driver; skipped")
                continue
            t = threading.Thread(target=self.pipeline, args=(run,), daemon=True)
            t.start()
            active.append(t)
        while any(t.is_alive() for t in active):
            time.sleep(1)
        return 0


def select(runs: list[Run], groups: Optional[list[str]], only: Optional[list[str]]) -> list[Run]:
    """The runs of ``groups`` (all when None) matching any ``only`` pattern (all when None), in plan order.
    A pattern is matched (``fnmatch``) against the run's name (``mutor_s0``) and against ``group/name``."""
    def wanted(r: Run) -> bool:
        return not only or any(fnmatch.fnmatchcase(r.name, p) or fnmatch.fnmatchcase(f"{r.group['name']}/{r.name}", p)
                               for p in only)
    return [r for r in runs if (not groups or r.group["name"] in groups) and wanted(r)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plan", type=Path, default=HERE / "plan.yaml")
    ap.add_argument("--group", action="append", default=None, help="only these groups (repeatable)")
    ap.add_argument("--only", action="append", default=None,
                    help="only runs matching these patterns, e.g. mutor_s0, 'gsm-smollm2-lora/*_s0', 'rg-*/*' "
                         "(repeatable)")
    ap.add_argument("--slots", type=int, default=2, help="runs side by side (default 2)")
    ap.add_argument("--threads", type=int, default=1, help="threads per run (default 1)")
    ap.add_argument("--runs-dir", default=None, help="where run directories go (default: the plan's runs_dir)")
    ap.add_argument("--results", default=None,
                    help="the results file rows are appended to and read from (default: the plan's results); "
                         "drafting.jsonl and first_hop.jsonl go beside it")
    ap.add_argument("--commit", action="store_true",
                    help="git-commit each new row (and its generations) in the repository holding the results "
                         "file; off by default")
    ap.add_argument("--list", action="store_true", help="print the plan and what is done, run nothing")
    ap.add_argument("--redraft", action="store_true",
                    help="measure drafting again with this code on the finished MuToR runs still on disk, "
                         "train nothing")
    ap.add_argument("--retrain", action="store_true",
                    help="with --redraft: train again the runs whose checkpoint is gone (a new machine), checking that "
                         "the final training loss equals the row's, then measure drafting")
    ap.add_argument("--keep-generations", action="store_true",
                    help="keep the scored generations of finished runs still on disk whose row has none, train nothing")
    args = ap.parse_args(argv)
    if args.retrain and not args.redraft:
        ap.error("--retrain goes with --redraft (it trains finished runs again only to measure their drafting)")
    plan, runs = load_plan(args.plan)
    runs = select(runs, args.group, args.only)
    driver = Driver(plan, args)
    if args.list:
        done = done_keys(driver.results)
        for r in runs:
            d = driver.runs_dir / r.group["name"] / r.name
            state = ("done" if r.key in done else "stopped" if r.group.get("stopped") else
                     "trained" if (d / "summary.json").is_file() else "partial" if d.exists() else "todo")
            print(f"{r.group['name']:24s} {r.name:28s} {r.steps:5d} steps  {state}")
        return 0
    if args.keep_generations:
        return driver.backfill_generations(runs)
    return driver.redraft(runs) if args.redraft else driver.main(runs)


if __name__ == "__main__":
    sys.exit(main())
