#!/usr/bin/env bash
# Call 15 (nvidia-h100-x4), on c84ef4e: the 4-rank rows the issues ask for "when lent":
# bench_muon + its torch gather-orthogonalize-scatter peer at 4 ranks (issue 34), and
# F32Accumulate at 4 ranks: bench_comm --f32-accumulate 256 MiB and the whole step (issue 31).
#   bash bench/results/runs/2026-11-27/15_x4.sh
set -u
OUT="${OUT:-/tmp/shardopt-out}"; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONUNBUFFERED=1
L="$OUT/lanes.log"; say() { echo "[$SECONDS s] $*" | tee -a "$L"; }
MPIRUN="mpirun --allow-run-as-root --oversubscribe --bind-to none"
nvidia-smi -L | tee -a "$L"
meson setup build-gpu -Dcuda-arch=90 -Dbuildtype=release -Dwerror=true >"$OUT/build.log" 2>&1
ninja -C build-gpu bench/bench_muon bench/bench_comm bench/bench_dist_adam >>"$OUT/build.log" 2>&1 || { say "build failed"; exit 1; }
say "build done"
timeout 90 python3 -m torch.distributed.run --standalone --nproc_per_node 4 bench/peers/muon_peer.py --out /tmp/peer_muon.tsv >"$OUT/muon_peer.txt" 2>&1
say "muon peer exit $?"
timeout 90 $MPIRUN -n 4 build-gpu/bench/bench_muon --peer /tmp/peer_muon.tsv --results bench/results >"$OUT/muon.txt" 2>&1
say "bench_muon 4 ranks exit $?"; grep -E '^\{"bench"' "$OUT/muon.txt" | cut -c1-400 | tee -a "$L"
timeout 60 $MPIRUN -n 4 build-gpu/bench/bench_comm --f32-accumulate --sizes-mib 256 --iters 20 --wait-timeout-s 40 --results bench/results >"$OUT/comm.txt" 2>&1
say "bench_comm --f32-accumulate 4 ranks exit $?"
timeout 60 $MPIRUN -n 4 build-gpu/bench/bench_dist_adam --grad-reduce-precision --results bench/results >"$OUT/dist.txt" 2>&1
say "bench_dist_adam --grad-reduce-precision 4 ranks exit $?"
tar czf "$OUT/results.tgz" bench/results "$OUT"/*.txt 2>/dev/null
rm -f "$OUT"/*.txt "$OUT"/build.log
