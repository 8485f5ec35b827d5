#!/usr/bin/env bash
# Stages the GPU test suites and an ats binary for a GPU machine without
# Go: the test binaries of the packages that have GPU tests, and ats,
# built with the tag atsfatbindir (they read the kernels from the
# checkout's cudadrv/kernels instead of embedding them, about 5 MB less
# each), compressed into .carry/ (git-ignored), about 12 MB in all.
#
#   tools/gpu/stage.sh            then, on the GPU machine, from the
#   tools/gpu/run.sh              repository root: every GPU suite
#   RUN_ATS=0 tools/gpu/stage.sh  the test binaries only
set -euo pipefail
root=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
out=$root/.carry
mkdir -p "$out"
rm -f "$out"/*.test "$out"/*.test.xz "$out"/ats "$out"/ats.xz
build=(-tags atsfatbindir -trimpath -ldflags='-s -w')
for p in cudadrv cudadrv/kernels runtime/backend/cuda runtime/session; do
	name=$(echo "$p" | tr / _)
	(cd "$root" && CGO_ENABLED=0 go test -c "${build[@]}" -o "$out/$name.test" "./$p")
done
if [[ "${RUN_ATS:-1}" != 0 ]]; then
	(cd "$root" && CGO_ENABLED=0 go build "${build[@]}" -o "$out/ats" ./cmd/ats)
fi
files=("$out"/*.test)
[[ "${RUN_ATS:-1}" != 0 ]] && files+=("$out/ats")
xz -T0 -6 "${files[@]}"
ls -l "$out"
