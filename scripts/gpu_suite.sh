#!/usr/bin/env bash
# The accelerator measurements in one command (after scripts/setup.sh
# and `pip install -e '.[gpu]'`):   bash scripts/gpu_suite.sh [OUT_DIR]
# Writes JSON under results/gpu/<device kind>/ (default): both benchmarks at the small and
# paper presets (tokens/s, MFU, statistics overhead ratios per backend) and a short
# training run of the paper model (bf16), with the device's name in every file.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
device=$($PY -c "import jax; print(jax.devices()[0].device_kind.replace(' ', '_'))")
out=${1:-results/gpu/$device}
mkdir -p "$out"
echo "[gpu_suite] device: $device -> $out"
$PY scripts/bench_stats.py --presets small,paper --batch-sizes 8,32 --reps 10 \
    --out "$out/bench_stats.json" > /dev/null
# The paper's scale for claim 1 (vmap at ~1.2B parameters): the cheap statistics only.
$PY scripts/bench_stats.py --presets 1b --batch-sizes 8 --reps 5 --stat-sets sq+sign \
    --no-layout-first --out "$out/bench_stats_1b.json" > /dev/null
for preset in small paper; do
  $PY scripts/bench_throughput.py --preset "$preset" --steps 20 > "$out/throughput_$preset.json"
  $PY scripts/bench_throughput.py --preset "$preset" --steps 20 stats=example \
      optimizer=adam_family optimizer.variant=micro_adam > "$out/throughput_${preset}_stats.json"
done
# The paper model at its real width on the embedded corpus (byte tokens; the model keeps
# its 32768-row tables), 200 steps, statistics logged every 50: a short run, not a result.
$PY -m pergrad.train model=paper data.tokenizer=byte data.vocab_size=32768 data.seq_len=512 \
    data.batch_size=64 data.eval_batch_size=64 train.steps=200 train.eval_every=100 \
    stats=example stats.log_every=50 logging.progress=false \
    train.out_dir="$out/paper_run" hydra.run.dir="$out/paper_run/hydra"
cp "$out/paper_run/summary.json" "$out/paper_train_summary.json"
echo "[gpu_suite] done: $(ls "$out")"
