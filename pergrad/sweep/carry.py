"""A stopped reproduction carried to another machine: its finished runs and its record.

    carry.pack(sweeps_root, record, "carry.tar.xz")    # on the machine that stops
    carry.unpack("carry.tar.xz", sweeps_root, record)  # on the one that continues

A reproduction (`scripts/reproduce.py all`) resumes where it stopped on the machine it ran
on: finished runs are skipped, the record continues. `pack` writes what that needs into one
archive: every sweep directory's own files (sweep.json with its training version, launch
logs, benchmarks' outputs), each finished run (`runs.DONE`) without its checkpoints, W&B
folder and logs (a finished run is never resumed), the reuse index (`reuse.INDEX`) and the
record (results/PRESET/reproduction.json) with the files it wrote beside it since it started
(the reports of the experiments it completed). Unfinished runs are left out: they start
again. Paths inside are relative to the sweeps root or written as `<sweeps-root>` and
`<repo>`, so the archive names no machine's path and unpacks under any root, for any
checkout. `unpack` refuses, before writing anything, an archive whose runs exist already
under the root, that holds no record, or whose record would replace another unfinished
one; the continued reproduction then checks the training version itself (`Record`,
`record_sweep`). Each run it restores says what was left out (`reuse.CARRIED`), so that it
counts as whole (`reuse.is_whole`) without its checkpoints.
"""

from __future__ import annotations

import datetime
import io
import json
import lzma
import os
import subprocess
import tarfile
from pathlib import Path

from pergrad.analysis.runs import DONE, HYDRA_CONFIG, run_status
from pergrad.files import METRICS, SUMMARY, write_bytes
from pergrad.sweep.presets import REPO
from pergrad.sweep.reuse import CARRIED, INDEX

RECORD = "reproduction.json"  # the record's name inside the archive
ROOT, REPO_MARK = "<sweeps-root>", "<repo>"  # what the runs' text files say for those paths
# A run directory's layout, as training writes it (pergrad.sweep reads pergrad through
# pergrad.files and pergrad.analysis only; tests/test_carry.py holds these to pergrad's names:
# pergrad.config.plan.CONFIG, pergrad.train.checkpoint.CHECKPOINTS, run_dir.RECORD).
CONFIG, RECORD_DIR = "config.yaml", str(HYDRA_CONFIG.parent)
LEFT_OUT = ("checkpoints", "wandb")  # folders of a finished run that nothing reads again


def _is_run(d: Path) -> bool:
  """A run directory: one the run has written into (a run just started has its config only)."""
  return any((d / f).exists() for f in (SUMMARY, METRICS, CONFIG, RECORD_DIR))


def _members(root: Path):
  """(path relative to root, Path) of what `pack` keeps, sorted; links as links."""
  keep = []
  for dirpath, dirnames, filenames in os.walk(root):
    here = Path(dirpath)
    run = here != root and _is_run(here) and not _is_run(here.parent)  # (not its .hydra/)
    if run and run_status(here) not in DONE:
      dirnames[:] = []  # an unfinished run: it starts again where it is continued
      continue
    if run:
      dirnames[:] = [d for d in dirnames if d not in LEFT_OUT]
    for name in [*dirnames, *filenames]:
      p = here / name
      if (p.is_symlink() or p.is_file()) and not (run and p.suffix == ".log"):
        keep.append(p)
    dirnames[:] = [d for d in dirnames if not (here / d).is_symlink()]
  return sorted((p.relative_to(root).as_posix(), p) for p in keep)


def _swap(data: bytes, pairs) -> bytes:
  """`data` with each (old, new) path replaced, if it is text (binary files as they are)."""
  try:
    text = data.decode()
  except UnicodeDecodeError:
    return data
  for old, new in pairs:
    text = text.replace(old, new)
  return text.encode()


def _written(record: Path, out: Path) -> list[Path]:
  """The files the reproduction wrote beside its record (results/PRESET/: the reports of the
  experiments it completed, which a continued one does not make again), since it started."""
  started = json.loads(Path(record).read_text()).get("started")
  if not started:  # a record of older code: it names no start
    return []
  started = datetime.datetime.fromisoformat(started)
  skip = {Path(record).resolve(), Path(out).resolve(), *_committed(Path(record).parent)}
  return sorted(p for p in Path(record).parent.rglob("*") if p.is_file()
                and p.resolve() not in skip and p.stat().st_mtime >= started.timestamp())


def _committed(folder: Path) -> set[Path]:
  """The files under `folder` that its git checkout holds as committed (tracked, unmodified:
  a carried archive that a pull brought in, say), which the reproduction did not write; none
  outside a git checkout."""
  git = lambda *a: subprocess.run(["git", *a], cwd=folder, capture_output=True, text=True)
  tracked, changed = git("ls-files", "-z", "--", "."), git("diff", "--name-only", "--relative",
                                                          "-z", "HEAD", "--", ".")
  if tracked.returncode or changed.returncode:
    return set()
  split = lambda out: {(folder / x).resolve() for x in out.stdout.split("\0") if x}
  return split(tracked) - split(changed)


def pack(sweeps_root: Path, record: Path, out: Path) -> dict:
  """Writes the archive `out` (xz tar); returns {"runs": finished runs, "results": files of
  results/PRESET/, "bytes": size}. Paths inside are relative to the sweeps root (index
  entries, reused runs' links) or written as `<sweeps-root>` and `<repo>` (in the runs' text
  files: configs, summaries, Hydra's records)."""
  root = Path(sweeps_root).resolve()
  if not Path(record).exists():
    raise FileNotFoundError(f"{record}: no reproduction record to carry; run "
                            "`scripts/reproduce.py all` first")
  buf, runs, results = io.BytesIO(), 0, _written(record, out)
  with tarfile.open(fileobj=buf, mode="w:xz") as tar:
    tar.add(record, arcname=RECORD)
    for p in results:
      tar.add(p, arcname="results/" + p.relative_to(Path(record).parent).as_posix())
    for rel, p in _members(root):
      info = tar.gettarinfo(str(p), arcname="runs/" + rel)
      if p.is_symlink():  # a reused run's link: relative to the root where it points inside
        target = Path(os.readlink(p))
        if target.is_absolute() and target.resolve().is_relative_to(root):
          info.linkname = os.path.relpath(target.resolve(), p.parent.resolve())
        tar.addfile(info)
      elif rel.startswith(INDEX + "/"):  # "<run dir>" -> relative to the root
        text = p.read_text().strip()
        text = os.path.relpath(text, root) if Path(text).is_absolute() else text
        data = text.encode()
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
      else:
        runs += p.name == SUMMARY
        data = _swap(p.read_bytes(), [(str(root), ROOT), (str(REPO), REPO_MARK)])
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
  write_bytes(out, buf.getvalue())
  return {"runs": runs, "results": len(results), "bytes": len(buf.getvalue())}


def unpack(archive: Path, sweeps_root: Path, record: Path) -> dict:
  """Restores the archive's runs under `sweeps_root` and its record at `record`; returns
  {"runs": finished runs restored}. Refuses (ValueError, nothing written) an archive without
  a record, a member or link target outside the root, or a member that exists already."""
  root = Path(sweeps_root).resolve()
  if not Path(archive).is_file():
    raise FileNotFoundError(f"{archive}: no such archive; make one with "
                            "`scripts/reproduce.py --carry-out FILE`")
  try:
    tar = tarfile.open(archive, mode="r:xz")
    members = tar.getmembers()  # reads the whole archive: a damaged one fails here
  except (tarfile.TarError, EOFError, OSError, lzma.LZMAError) as e:
    raise ValueError(f"{archive}: not a readable carried archive (.tar.xz: {e}); make one "
                     "with `scripts/reproduce.py --carry-out FILE`") from None
  with tar:
    names = [m.name for m in members]
    if RECORD not in names:
      raise ValueError(f"{archive}: not a carried reproduction (no {RECORD}); make one with "
                       "`scripts/reproduce.py --carry-out FILE`")
    here = lambda n: (root / n[5:]).is_symlink() or (root / n[5:]).is_file()
    clash = [n for n in names if n.startswith("runs/") and here(n)]
    if clash:
      raise ValueError(f"{archive}: {len(clash)} file(s) exist already under {root} (e.g. "
                       f"{clash[0][5:]}); unpack into an empty --sweeps-root")
    old = json.loads(Path(record).read_text()) if Path(record).exists() else {}
    if old and not old.get("finished") and old != json.loads(tar.extractfile(RECORD).read()):
      raise ValueError(f"{record} is another reproduction, unfinished; finish it, or move it "
                       "away, before unpacking this one")
    for m in members:  # each member, and each link's target, inside its folder
      rel = Path(m.name.split("/", 1)[1]) if "/" in m.name else Path(m.name)
      out = (rel.is_absolute() or ".." in rel.parts or m.name.startswith("results/")
             and not m.isfile() or m.issym() and not (
                 root / rel.parent / m.linkname).resolve().is_relative_to(root))
      if out:
        raise ValueError(f"{archive}: member {m.name} lies outside the sweeps root")
    runs = 0
    for m in members:
      if m.name == RECORD or m.name.startswith("results/"):  # beside the record: its reports
        dest = Path(record) if m.name == RECORD else Path(record).parent / m.name[8:]
        write_bytes(dest, tar.extractfile(m).read())
        continue
      dest = root / m.name[5:]
      dest.parent.mkdir(parents=True, exist_ok=True)
      if m.issym():
        dest.symlink_to(m.linkname)
      elif m.name.startswith(f"runs/{INDEX}/"):
        rel = tar.extractfile(m).read().decode().strip()
        write_bytes(dest, str(root / rel if not Path(rel).is_absolute() else rel).encode())
      else:
        write_bytes(dest, _swap(tar.extractfile(m).read(), [(ROOT, str(root)),
                                                            (REPO_MARK, str(REPO))]))
        os.utime(dest, (m.mtime, m.mtime))
        if dest.name == SUMMARY:  # a finished run, carried without its checkpoints
          runs += 1
          write_bytes(dest.parent / CARRIED, json.dumps({"left_out": list(LEFT_OUT)}).encode())
  return {"runs": runs, "record": json.loads(Path(record).read_text()).get("command")}
