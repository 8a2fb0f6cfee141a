"""results/PRESET/reproduction.json: the record of an end-to-end `reproduce.py all`."""

from __future__ import annotations

import datetime
import json
import threading
import time
from pathlib import Path

from pergrad.sweep import REPO, record, recorded_version, training_version
from pergrad.sweep.report_md import portable_command


class Record:
  """results/PRESET/reproduction.json of `all`, rewritten after each experiment and every
  minute, so an invocation that is stopped leaves its record. An unfinished record of the
  same command at the same training version (`pergrad.sweep.reuse.training_version`: the runs
  are the same runs) is continued, whatever its commit: its invocations listed with their
  commits, their wall times summed; a stopped reproduction resumes where it was, skipping
  the runs that finished, and an experiment completed at an older commit is analysed again
  at this one (its runs skipped), so every report is the last commit's."""

  def __init__(self, path: Path, command: str, fresh: bool, heartbeat_s: float = 60.0):
    self.path, self.t0 = Path(path), time.time()
    command = portable_command(command)  # no machine's path in results/
    prov = {**record.provenance(), "train_version": training_version(REPO)}
    old = json.loads(self.path.read_text()) if self.path.exists() else {}
    now = datetime.datetime.now().isoformat(timespec="seconds")
    if prov["train_version"] and not old.get("finished") and old.get("command") == command \
        and recorded_version(old, REPO) == prov["train_version"]:
      self.d = old
      for e in [*old["experiments"].values(), *old["invocations"]]:
        e.setdefault("commit", old["commit"])  # written before entries named their commit
      self.d.update(prov, clean=bool(old.get("clean")) and prov["clean"])
    else:
      self.d = {"command": command, **prov, "fresh": fresh, "started": now,
                "experiments": {}, "invocations": []}
    self.done = dict(self.d["experiments"])  # what earlier invocations recorded
    stopped = self.d.pop("running", None)  # the experiment a stopped invocation was in
    if stopped:
      self.done[stopped["name"]] = {"wall_s": stopped["wall_s"],
                                    "launch_wall_s": stopped["wall_s"], "launched": 0,
                                    "skipped": 0, "partial": True}
    self._running = None
    self.d["invocations"].append({"started": now, "wall_s": 0.0, "commit": prov["commit"]})
    self._lock = threading.Lock()
    self._stop = threading.Event()
    self._write()
    threading.Thread(target=self._beat, args=(heartbeat_s,), daemon=True).start()

  def _beat(self, every: float) -> None:
    while not self._stop.wait(every):
      self._write()

  def _write(self) -> None:
    with self._lock:
      now = time.time()
      self.d["invocations"][-1]["wall_s"] = round(now - self.t0, 1)
      if self._running:
        self.d["running"] = {"name": self._running[0], "wall_s": round(now - self._running[1], 1)}
      else:
        self.d.pop("running", None)
      self.d["wall_s"] = round(sum(i["wall_s"] for i in self.d["invocations"]), 1)
      self.path.parent.mkdir(parents=True, exist_ok=True)
      tmp = self.path.with_suffix(".tmp")
      tmp.write_text(json.dumps(self.d, indent=1))
      tmp.replace(self.path)

  def finished_before(self, name: str) -> bool:
    """Whether an earlier invocation of this record completed experiment `name` at this commit,
    or at one that differs from it in results/ only (`record.same_code`: a carried reproduction's
    commits); it is not run again: its results and run_info.json stay those of the launches
    that made them."""
    e = self.done.get(name)
    return (bool(e) and not e.get("partial") and str(e.get("status", "")).startswith("completed")
            and record.same_code(e.get("commit"), self.d["commit"]))

  def begin(self, name: str) -> None:
    """Marks `name` running; its clock starts at the wall time earlier stopped invocations
    spent on it, so a record stopped in it again keeps them all."""
    earlier = self.done.get(name, {})
    with self._lock:
      self._running = (name, time.time() - (earlier["wall_s"] if earlier.get("partial") else 0))
    self._write()

  def experiment(self, name: str, entry: dict) -> None:
    """Records one experiment; an earlier invocation's wall time for it is added. Its launches
    are added only where it was stopped (it wrote no run_info.json): otherwise `entry` holds
    them already, as run_info.json sums the invocations at its commit and sweep. The runs a
    stopped invocation of a fresh reproduction finished count as launched, not skipped."""
    old = self.done.get(name)
    if old and old.get("partial") and self.d["fresh"]:
      entry = {**entry, "launched": entry["launched"] + entry["skipped"], "skipped": 0}
    if old:
      summed = ("wall_s", "launch_wall_s", "launched") if old.get("partial") else ("wall_s",)
      entry = {**entry, **{k: round(old.get(k, 0) + entry[k], 1) if k != "launched"
                           else old.get(k, 0) + entry[k] for k in summed},
               "skipped": entry["skipped"] if old.get("partial") else old.get("skipped", 0)}
    with self._lock:
      self.d["experiments"][name] = {**entry, "commit": self.d["commit"]}
      self._running = None
    self._write()

  def finish(self) -> dict:
    self._stop.set()
    self.d["finished"] = datetime.datetime.now().isoformat(timespec="seconds")
    self._write()
    return self.d
