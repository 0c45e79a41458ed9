#!/usr/bin/env bash
# Reproduce every table in BENCHMARKS.md with one command (from a source checkout):
#   1. conduit bench all   — micro-benchmark, synthetic loop, cost-model validation (~50 min on 2 cores),
#      then the micro-benchmark once more with one transition per push (~3 min)
#   2. the RLlib tables    — DQN convergence on CartPole, large observations, DQN/PPO side by side (~13 min),
#      then with 1 and 2 learner actors (~45 min)
#   3. the other tables    — the sharded buffer across ranks, the strong-scaling model, the placement sweep,
#      verl's trainers against Conduit's (~4 min) and the post-generation model, SRL's buffers (SRL's own classes
#      where CONDUIT_SRL_SRC names a checkout) (~14 min)
# Sets up .venv with the bench, rllib, verl and srl extras first (scripts/bootstrap.sh). Writes to OUT (default
# bench-results.md): first the summary (`conduit bench summary`: one table per question, medians with their
# spread), then every table in the order of BENCHMARKS.md; the figures and bench-all.json (the results of
# `conduit bench all`, the summary's input) next to it.
#   scripts/bench-all.sh [OUT.md] [--only-rllib | --no-rllib] [--no-others]
set -euo pipefail
cd "$(dirname "$0")/.."
out="bench-results.md"
conduit_part=1
rllib_part=1
others_part=1
for arg in "$@"; do
  case "$arg" in
    --only-rllib) conduit_part=0; others_part=0 ;;
    --no-rllib) rllib_part=0 ;;
    --no-others) others_part=0 ;;
    -*) echo "bench-all: unknown option $arg" >&2; exit 2 ;;
    *) out="$arg" ;;
  esac
done
scripts/bootstrap.sh "bench,rllib,verl,srl"
py=.venv/bin/python
figures="$(dirname "$out")"
: >"$out"

if [ "$conduit_part" = 1 ]; then
  results="$figures/bench-all.json"
  echo "bench-all: conduit bench all (tables -> $out, figures -> $figures, results -> $results)" >&2
  part=$(mktemp)
  .venv/bin/conduit bench all --markdown "$part" --plot-dir "$figures" --save-json "$results"
  .venv/bin/conduit bench summary "$results" >>"$out"
  printf '\n' >>"$out"
  cat "$part" >>"$out"
  # a loop that adds every environment step as it comes (the issues' tables push chunks of 256)
  .venv/bin/conduit bench micro --chunk 1 --dims 17,128,1000 --markdown "$part"
  printf '\n' >>"$out"
  sed '1s/^## .*/## Micro-benchmarks: one transition per call (`conduit bench micro --chunk 1 --dims 17,128,1000`)/' \
    "$part" >>"$out"
  rm -f "$part"
fi

if [ "$rllib_part" = 1 ]; then
  # the RLlib runs share two cores with Ray's workers: one intra-op thread each, as in BENCHMARKS.md
  export OMP_NUM_THREADS=1
  rllib() {  # heading, then the command's markdown (its progress lines go to stderr)
    echo "bench-all: $*" >&2
    { printf '\n### `%s`\n\n' "$*"; "$py" "$@" 2> >(cat >&2); } >>"$out"
  }
  printf '\n## RLlib: DQN, SAC and PPO with the adapter\n' >>"$out"
  rllib scripts/bench_rllib_convergence.py --threshold 150 --seeds 0 1 2
  rllib examples/rllib_large_obs.py --iterations 8
  rllib examples/rllib_large_obs.py --iterations 8 --prefetch
  rllib examples/rllib_dqn_cartpole.py --compare --iterations 8
  rllib examples/rllib_ppo_cartpole.py --compare --iterations 8
  # several learner actors (with 2, Conduit shards the buffer over them); each iteration takes 15-30 s here
  rllib scripts/bench_rllib_convergence.py --threshold 150 --seeds 0 1 2 --learners 2 --max-iterations 12 --max-minutes 30
  rllib scripts/bench_rllib_convergence.py --threshold 150 --seeds 0 --learners 1 --max-iterations 6
  rllib examples/rllib_large_obs.py --iterations 6 --learners 1
  rllib examples/rllib_large_obs.py --iterations 6 --learners 2
fi
if [ "$others_part" = 1 ]; then
  other() {  # heading, then the command's output (its progress lines go to stderr)
    echo "bench-all: $*" >&2
    { printf '\n### `%s`\n\n' "$*"; "$py" "$@" 2> >(cat >&2); } >>"$out"
  }
  printf '\n## Across ranks, placement, verl and SRL\n' >>"$out"
  other -m benchmarks.distributed --train
  other scripts/scaling_table.py
  other scripts/planner_sweep.py --capacity 100000
  other -m benchmarks.verl_trainers --repeats 7
  other benchmarks/verl_path.py --repeats 7
  other -m benchmarks.srl_buffer --repeats 7 --steps 20
fi
echo "bench-all: wrote $out" >&2
