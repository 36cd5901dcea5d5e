# bench/device_build.sh — sourced by the device try-out scripts (decode_try.sh, ncu_bwd.sh,
# ncu_sm90.sh, sm90_try.sh): builds as gpu.sh's build stage does (BUILD, CUDA_ARCHS,
# CMAKE_ARGS, COMMIT as there) and puts the cmocka/cJSON it unpacked on LD_LIBRARY_PATH for the
# test binaries. A failed build prints the log's tail, copies the log to $OUT/build.log and
# exits 1.
STAGES=build OUT=/tmp/fa-build bash bench/gpu.sh >/tmp/fa-build.log 2>&1 ||
  { tail -n 60 /tmp/fa-build.log; cp /tmp/fa-build.log "$OUT/build.log"; exit 1; }
LIBDIR=$(dirname "$(find /tmp/deps -name 'libcmocka.so*' | head -n 1)")
export LD_LIBRARY_PATH="$LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
