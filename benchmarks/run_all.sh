#!/usr/bin/env bash
# Every benchmark of docs/performance.md's table, one after the other, with the table's commands:
# one set of figures at one commit. Each one's output goes to OUT/<name>.txt (default
# build/benchmarks), and its wall time to OUT/times.txt. Nothing else should run meanwhile.
#
#     bash benchmarks/run_all.sh [OUT]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-build/benchmarks}
mkdir -p "$OUT"
PY=.venv/bin/python
git rev-parse --short HEAD > "$OUT/commit.txt"
run() {
  local name=$1; shift
  local began=$SECONDS
  echo "== $name: $*" | tee -a "$OUT/times.txt"
  PYTHONUNBUFFERED=1 "$PY" "$@" > "$OUT/$name.txt" 2>&1
  echo "   exit $? after $((SECONDS - began)) s" | tee -a "$OUT/times.txt"
}
run train_overhead benchmarks/train_overhead.py
run jobs_overhead benchmarks/jobs_overhead.py --reps 5
run small_jobs benchmarks/small_jobs.py --reps 2 --jobs 10 --one-off-jobs 3 --tune-reps 1
run tune_efficiency benchmarks/tune_efficiency.py --reps 3
run serve_throughput benchmarks/serve_throughput.py
run model_server benchmarks/model_server.py --rounds 2 --seconds 5
run batch_inference benchmarks/batch_inference.py --reps 5
run preemption benchmarks/preemption.py --reps 2
run driver_memory benchmarks/driver_memory.py
run fsdp_memory benchmarks/fsdp_memory.py
run fsdp_memory_default_malloc benchmarks/fsdp_memory.py --default-malloc
run rl_ppo benchmarks/rl_ppo.py
run hf_trainer benchmarks/hf_trainer.py
run lora benchmarks/lora.py --epochs 5
run llm_serving benchmarks/llm_serving.py
run first_contact benchmarks/first_contact.py --reps 3
run second_size benchmarks/second_size.py --reps 3
run idle_cost benchmarks/idle_cost.py
run plain_ddp benchmarks/plain_ddp.py
