#!/usr/bin/env bash
# The GPU checks of a short lease, in one call (a lease may be 15 minutes in all): the training step before and
# after the step-efficiency fixes, SRU++ and Conformer at the LibriSpeech shape (~98 M parameters, bf16, a 200-s
# batch), with a torch.profiler table of each (device time, host syncs, aten calls per step); the same under
# torch.compile; optionally with cudnn.benchmark and the recurrence's kernel variants; then every GPU test. Each
# part has its own time limit, so one that hangs costs only its share.
#
#   here:  rm -rf exp/baseline && mkdir -p exp/baseline &&
#          git archive BASE srupp_asr benchmarks | tar -x -C exp/baseline  (the code before the fixes; drop its
#          default_model; a BASE before srupp_asr/kernels existed also needs kernels, moved to srupp_asr/kernels).
#          For the host-sync fixes of issue 28 (2026-11-28), BASE is a431923 (964b7dd's parent, before them;
#          the fused Adam / contiguous mask / 2x8 fixes were already in it).
#   there: benchmarks/gpu_session.sh        (carry .whl, the wheels the machine lacks, and exp/baseline)
#
# PARTS picks the parts (default "after before graphs compile tests"; also "decode", "cudnn", "recurrence");
# TESTS, the GPU tests' pytest arguments (default: all of them, through tests/run_gpu_tests.py). The decoding GPU
# tests and part decode synthesise speech with espeak-ng: carry its .debs in .espeak_debs (and the wheels in .whl;
# recipes/synth_en/local/prepare_lease.sh makes both) and they are installed first.
#
# Logs and tables go to $OUT (the device tool's folder) or exp/gpu_session; the tables are printed last.
set -uo pipefail
out=${OUT:-exp/gpu_session}
py=${PYTHON:-python3}
mkdir -p "$out"
say() { echo "[$(date -u +%H:%M:%S)] $*"; }

if [ -d .whl ]; then
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site
fi
"$py" -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1 || say "editable install failed"
if [ -d .espeak_debs ] && ! command -v espeak-ng >/dev/null; then
  bash recipes/synth_en/local/install_debs.sh --no-check .espeak_debs >/dev/null || say "espeak-ng debs failed"
fi
parts=" ${PARTS:-after before graphs compile tests} "
part() { [[ $parts == *" $1 "* ]]; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv | tee "$out/gpu.txt"
export PYTHONUNBUFFERED=1

throughput=(benchmarks/train_throughput.py --size large --device cuda --precision bf16 --encoders srupp conformer)
part after && say "training step, after the fixes (profiled)" &&
  timeout 130 "$py" "${throughput[@]}" --profile 3 >"$out/throughput_after.md" 2>"$out/throughput_after.err"
if [ -d exp/baseline ] && part before; then
  say "training step, before the fixes (exp/baseline)"
  PYTHONPATH=exp/baseline${PYTHONPATH:+:$PYTHONPATH} timeout 130 "$py" exp/baseline/"${throughput[0]}" \
    "${throughput[@]:1}" --profile 3 >"$out/throughput_before.md" 2>"$out/throughput_before.err"
fi
# CUDA graphs (srupp_asr.graphs, issue 39): 8 batch shapes in turn (as a sampler's batches vary), SRU++ eager, SRU++
# with its forward and backward in graphs (each shape recorded in its warm-up step) and the Conformer eager, in one
# run; at the large size's 200-s batch and at the LibriSpeech recipe's 600 s (conf/librispeech_srupp.yaml).
shapes=(--batches 8 --warmup-steps 8 --steps 16 --cuda-graphs)
if part graphs; then
  say "training step over 8 batch shapes: SRU++ eager, SRU++ in CUDA graphs, Conformer eager (200 s)"
  timeout 240 "$py" "${throughput[@]}" "${shapes[@]}" >"$out/throughput_graphs.md" 2>"$out/throughput_graphs.err"
  say "the same at 600 s a batch"
  timeout 300 "$py" "${throughput[@]}" "${shapes[@]}" --batch-seconds 600 >"$out/throughput_graphs_600.md" \
    2>"$out/throughput_graphs_600.err"
fi
# torch.compile: the first warm-up step compiles (a minute or two per encoder at this size; the parts together fit
# 15 minutes of device time with the machine's start only if compile takes under 4 minutes).
part compile && say "training step, after the fixes, torch.compile (profiled)" &&
  timeout 240 "$py" "${throughput[@]}" --compile --profile 3 >"$out/throughput_compile.md" \
  2>"$out/throughput_compile.err"
# Decoding on the GPU (issue 39, item 4: joint decoding RTF <= 0.005 on decoding_defaults.py's 20 sentences):
# transcribe's defaults (joint, beam 20, the built-in model's LM and word list; 32 files a batch on a GPU) and the
# defaults before 2026-12-01 (default_before: beam 10, the LM alone; the word list's scorer works on the host,
# one transfer a step more), with the CTC frames in a loop and in closed form (scorers.CTC_RECURSION; a GPU's default is the closed form),
# on the 20 sentences and a 3-minute recording, each set decoded once untimed first; the defaults again at the CPU's
# batch of 8; then the search alone, per mode (decoding_speed.py, no LM), and its calls, host syncs and kernel
# launches per output step, per scorer, both ways (search_ops.py). They speak with espeak-ng: carry .espeak_debs.
# decoding_defaults.py writes each row to its .err file as it finishes: a timeout keeps the rows done.
if part decode; then
  say "decoding on the GPU: transcribe's defaults and those before the word list, CTC frames looped and in closed form"
  timeout 360 "$py" benchmarks/decoding_defaults.py --device cuda --warmup --minutes 3 --modes default default_before \
    --ctc-recursions loop scan >"$out/decoding_gpu.md" 2>"$out/decoding_gpu.err"
  say "transcribe's defaults at 8 files a batch"
  timeout 90 "$py" benchmarks/decoding_defaults.py --device cuda --warmup --minutes --modes default --batch-size 8 \
    >"$out/decoding_gpu_batch8.md" 2>"$out/decoding_gpu_batch8.err"
  say "the beam searches alone on the GPU (decoding_speed.py)"
  timeout 120 "$py" benchmarks/decoding_speed.py --model srupp_asr/default_model --device cuda --beam 10 \
    >"$out/decoding_speed_gpu.md" 2>&1
  for recursion in loop scan; do
    timeout 90 "$py" benchmarks/search_ops.py --device cuda --ctc-recursion $recursion \
      >"$out/search_ops_gpu_$recursion.md" 2>&1
  done
fi
part cudnn && say "training step, after the fixes, cudnn.benchmark" &&
  timeout 100 "$py" "${throughput[@]}" --cudnn-benchmark >"$out/throughput_cudnn.md" 2>"$out/throughput_cudnn.err"
part recurrence && say "recurrence kernel variants" &&
  timeout 50 "$py" benchmarks/recurrence_speed.py --skip-cpu --repeats 20 --gpu-variants 1x4,2x8 \
  >"$out/recurrence.md" 2>&1
if part tests; then
  say "GPU tests"
  if [ -n "${TESTS:-}" ]; then
    # shellcheck disable=SC2086
    timeout "${GPU_TEST_SECONDS:-120}" "$py" -m pytest -q -m gpu -p no:cacheprovider $TESTS >"$out/gpu_tests.log" 2>&1
  else
    timeout "${GPU_TEST_SECONDS:-120}" "$py" tests/run_gpu_tests.py >"$out/gpu_tests.log" 2>&1
  fi
  echo "gpu tests exit status $?" >>"$out/gpu_tests.log"
fi
say "done"

for f in throughput_before throughput_after throughput_graphs throughput_graphs_600 throughput_compile throughput_cudnn; do
  [ -f "$out/$f.md" ] || continue
  echo "== $f"
  grep -E '^(device|size|\| |srupp:|conformer:|per step)' "$out/$f.md" | grep -v '^| *aten\|^| *-' | head -12
  tail -3 "$out/$f.err"
done
for f in decoding_gpu decoding_gpu_batch8 decoding_speed_gpu search_ops_gpu_loop search_ops_gpu_scan; do
  [ -f "$out/$f.md" ] && echo "== $f" && grep -E '^(command|date|Model|\| )' "$out/$f.md"
done
[ -f "$out/recurrence.md" ] && echo "== recurrence" && grep -E '^\| (bfloat16|float32)' "$out/recurrence.md" | grep 'forward+backward'
[ -f "$out/gpu_tests.log" ] && echo "== gpu tests" && tail -25 "$out/gpu_tests.log"
