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
#   SUITES="kernels cuda" tools/gpu/stage.sh   some suites' binaries only
#                                 (cudadrv kernels cuda session)
#   BRANCH=kvq8i8 tools/gpu/stage.sh           another branch's binaries,
#                                 built in a temporary worktree, and its
#                                 kernels with their sources
#                                 (.carry/fatbin.tar.xz, which run.sh
#                                 unpacks and reads instead of the
#                                 checkout's): run from this checkout
#
# It prints the bytes a call would carry: the tracked tree plus .carry/.
# A GPU machine's call carries at most 64 MiB, and calls of about 63.5 MiB
# were refused; stage fewer suites, or ats in a call of its own, above that.
set -euo pipefail
root=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
out=$root/.carry
mkdir -p "$out"
rm -rf "$out"/*.test "$out"/*.test.xz "$out"/ats "$out"/ats.xz "$out"/fatbin.tar "$out"/fatbin.tar.xz "$out"/branch-kernels
src=$root
if [[ -n "${BRANCH:-}" ]]; then
	src=$(mktemp -d)/src
	git -C "$root" worktree add -q --detach "$src" "$BRANCH"
	trap 'git -C "$root" worktree remove --force "$src"' EXIT
	(cd "$src/cudadrv/kernels" && tar -cf "$out/fatbin.tar" fatbin ptx ./*.cu ./*.cuh)
fi
build=(-tags atsfatbindir -trimpath -ldflags='-s -w')
declare -A pkg=([cudadrv]=cudadrv [kernels]=cudadrv/kernels [cuda]=runtime/backend/cuda [session]=runtime/session)
for s in ${SUITES:-cudadrv kernels cuda session}; do
	p=${pkg[$s]:?"stage.sh: no suite $s (cudadrv kernels cuda session)"}
	name=$(echo "$p" | tr / _)
	(cd "$src" && CGO_ENABLED=0 go test -c "${build[@]}" -o "$out/$name.test" "./$p")
done
if [[ "${RUN_ATS:-1}" != 0 ]]; then
	(cd "$src" && CGO_ENABLED=0 go build "${build[@]}" -o "$out/ats" ./cmd/ats)
fi
files=("$out"/*.test)
[[ "${RUN_ATS:-1}" != 0 ]] && files+=("$out/ats")
[[ -e "$out/fatbin.tar" ]] && files+=("$out/fatbin.tar")
xz -T0 -6 "${files[@]}"
ls -l "$out"
tracked=$(cd "$root" && git ls-files -z | xargs -0 stat -c %s 2>/dev/null | awk '{s += $1} END {print s}')
carried=$(du -cb "$out" | tail -1 | cut -f1)
total=$((tracked + carried))
echo "a call carries $((total / 1048576)) MiB: the tracked tree $((tracked / 1048576)) MiB, .carry/ $((carried / 1048576)) MiB"
if ((total > 63 * 1048576)); then
	echo "stage.sh: over 63 MiB: stage fewer suites (SUITES=...) or ats in a call of its own (RUN_ATS=0)" >&2
fi
