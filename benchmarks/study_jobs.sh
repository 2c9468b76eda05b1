#!/bin/bash
# Is running two study trainings at once (one thread each) faster than one after the other on this machine?
# Trains the study's DPO recipe for STEPS steps from a study's backbone once alone, then twice at once, and prints
# the wall times side by side (the ratio > 1 means two at once gain throughput).
#   benchmarks/study_jobs.sh outputs/study [STEPS]      (a folder where `python -m study` built the backbone)
set -e
STUDY=${1:?usage: benchmarks/study_jobs.sh STUDY_OUT [STEPS]}; STEPS=${2:-30}
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD OMP_NUM_THREADS=1
PY=${PY:-.venv/bin/python}
TMP=$(mktemp -d)
one() {
  $PY -m accelerate.commands.launch --config_file accelerate_configs/cpu.yaml train/dpo.py recipes/study/dpo.yaml \
    --model_name_or_path "$STUDY/backbone" --train_data_path "$STUDY/synthetic-spy-tune/train_data.json" \
    --image_folder "$STUDY/synthetic-spy-tune" --output_dir "$TMP/$1" --max_steps "$STEPS" --save_strategy no \
    --seed "$2" > "$TMP/$1.log" 2>&1
}
s=$(date +%s.%N); one alone 0; alone=$(echo "$(date +%s.%N) - $s" | bc)
s=$(date +%s.%N); one a 0 & one b 1 & wait; both=$(echo "$(date +%s.%N) - $s" | bc)
echo "one run alone: ${alone} s; two runs at once: ${both} s; throughput ratio (2 x alone / both): $(echo "scale=2; 2 * $alone / $both" | bc)"
echo "load: $(cut -d' ' -f1-3 /proc/loadavg)"
rm -rf "$TMP"
