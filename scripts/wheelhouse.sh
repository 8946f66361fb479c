#!/usr/bin/env bash
# The wheels a GPU box with no package access needs beside its own torch, in one folder of at most
# 64 MiB (what scripts/gpu_check.sh installs with --no-index).
#
#     bash scripts/wheelhouse.sh DIR [--python 3.12] [--platform manylinux_2_28_x86_64]
#                                    [--assume numpy,pyarrow]
#     bash scripts/wheelhouse.sh DIR --check       # only the checks below, on an existing folder
#
# Run it from a checkout on a machine with package access. DIR must be new or empty.
# - What: the project's own dependencies, its `torch` extra without torch itself, and from its `test`
#   extra what the GPU check runs (pytest, hypothesis), every one resolved by pip for the target
#   Python and platform (--only-binary; manylinux_2_N accepts every older manylinux tag, which are
#   passed to pip too). Torch, vLLM and triton are constrained out (`<0`), so nothing can pull them,
#   and the folder is checked to hold no torch, nvidia-*, triton or vllm wheel.
# - Left out, so that the folder fits 64 MiB: the optional sinks and plots of the `test` extra
#   (matplotlib, tensorboard, wandb: about 60 MiB more, Ray, 70 MiB, mkdocs for the docs build; the
#   gpu tests and the default job run without them, their tests skip) and, by default, numpy and pyarrow (--assume: pip resolves them,
#   then their wheels are removed). pyarrow alone is 52 MiB and numpy 15 MiB, which together exceed
#   the cap; the default job needs both (datasets, through the digits task). A CUDA torch image
#   carries them as a rule (this workplace's H200 image does); scripts/gpu_check.sh checks that the
#   target's versions satisfy every wheel here and names what is missing. `--assume ''` keeps them
#   (then the folder exceeds the cap and is refused).
# - The project's own wheel: with the C ring extension when the target is this machine's Python,
#   processor and a glibc no older than this machine's (an extension built here would not load on
#   an older one); pure Python (py3-none-any) otherwise: shm.ring falls back to its Python path.
# - The guard: the folder's size (apparent bytes, what travels) is printed; above 64 MiB the script
#   refuses, one line, exit 1, and leaves DIR empty. Bad arguments: one line, exit 2.
set -euo pipefail

CAP_MIB=64
FORBIDDEN='^(torch|nvidia_|triton|vllm)'             # normalized wheel-name prefixes
SINKS='matplotlib|tensorboard|wandb|peft|ray|mkdocs|mkdocs-material'   # test-extra entries the GPU check goes without
                                                     # (peft requires torch: it cannot resolve beside it)
ROOT="$(cd "$(dirname "$0")/.." && pwd)"

die() { echo "wheelhouse: $1" >&2; exit "${2:-2}"; }

dir="" python_version="3.12" platform="manylinux_2_28_x86_64" assume="numpy,pyarrow" check_only=0
while [ $# -gt 0 ]; do
    case "$1" in
        --python) [ $# -ge 2 ] || die "--python needs a version such as 3.12"; python_version="$2"; shift 2 ;;
        --platform) [ $# -ge 2 ] || die "--platform needs a tag such as manylinux_2_28_x86_64"; platform="$2"; shift 2 ;;
        --assume) [ $# -ge 2 ] || die "--assume needs a comma-separated list (or '')"; assume="$2"; shift 2 ;;
        --check) check_only=1; shift ;;
        -h|--help) sed -n '2,31p' "$0"; exit 0 ;;
        -*) die "unknown option $1 (see --help)" ;;
        *) [ -z "$dir" ] || die "one DIR only (got '$dir' and '$1')"; dir="$1"; shift ;;
    esac
done
[ -n "$dir" ] || die "usage: wheelhouse.sh DIR [--python 3.12] [--platform manylinux_2_28_x86_64] [--assume numpy,pyarrow] [--check]"
[[ "$python_version" =~ ^3\.([0-9]+)$ ]] || die "--python $python_version is not a Python version such as 3.12"
py_minor="${BASH_REMATCH[1]}"
[[ "$platform" =~ ^manylinux_2_([0-9]+)_(x86_64|aarch64)$ ]] \
    || die "--platform $platform is not a manylinux_2_N_ARCH tag such as manylinux_2_28_x86_64"
glibc_minor="${BASH_REMATCH[1]}" arch="${BASH_REMATCH[2]}"
[[ "$assume" =~ ^[A-Za-z0-9._,-]*$ ]] || die "--assume '$assume' is not a comma-separated list of package names"

# check DIR [NAME]: no forbidden wheel, size under the cap; prints the size or refuses (exit 1)
check() {
    local d="$1" name="${2:-$1}" bad bytes mib big
    bad=$(cd "$d" && ls | awk -v re="$FORBIDDEN" '{f = tolower($0); gsub(/-/, "_", f)} f ~ re' \
          | paste -sd' ')
    [ -z "$bad" ] || die "$name holds wheels that belong to the GPU image, not the wheelhouse: $bad" 1
    bytes=$(find "$d" -type f -printf '%s\n' | awk '{s += $1} END {print s + 0}')
    mib=$(awk -v b="$bytes" 'BEGIN {printf "%.1f", b / 1048576}')
    if [ "$bytes" -gt $((CAP_MIB << 20)) ]; then
        big=$(cd "$d" && find . -type f -printf '%s %f\n' | sort -rn | head -3 \
              | awk '{printf "%s%s %.1f MiB", (NR > 1 ? ", " : ""), $2, $1 / 1048576}')
        die "refused: $name holds $mib MiB, over the $CAP_MIB MiB cap (largest: $big)" 1
    fi
    echo "wheelhouse $name: $(find "$d" -name '*.whl' | wc -l) wheels, $mib MiB of $CAP_MIB MiB"
}

if [ "$check_only" = 1 ]; then
    [ -d "$dir" ] || die "$dir is not a folder"
    check "$dir"
    exit 0
fi

if [ -e "$dir" ] && [ -n "$(ls -A "$dir" 2>/dev/null)" ]; then
    die "$dir is not empty: give a new or empty folder"
fi
mkdir -p "$dir"
dir="$(cd "$dir" && pwd)"
stage="$(mktemp -d "$dir.partial.XXXXXX")"
work="$(mktemp -d)"
trap 'rm -rf "$stage" "$work"' EXIT

# requirements: from pyproject.toml, so they follow its edits
python3 - "$ROOT/pyproject.toml" "$SINKS" > "$work/requirements.txt" <<'EOF'
import re, sys, tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
extras = project["optional-dependencies"]
name = lambda req: re.split(r"[\s<>=!~;\[]", req, maxsplit=1)[0].lower()
reqs = list(project["dependencies"])
reqs += [r for r in extras["torch"] if name(r) != "torch"]
reqs += [r for r in extras["test"] if not re.fullmatch(sys.argv[2], name(r))]
print("\n".join(reqs))
EOF
printf 'torch<0\ntriton<0\nvllm<0\n' > "$work/constraints.txt"

platforms=()
for ((n = glibc_minor; n >= 5; n--)); do platforms+=(--platform "manylinux_2_${n}_$arch"); done
[ "$glibc_minor" -ge 17 ] && platforms+=(--platform "manylinux2014_$arch")
[ "$glibc_minor" -ge 12 ] && [ "$arch" = x86_64 ] && platforms+=(--platform "manylinux2010_$arch")
[ "$arch" = x86_64 ] && platforms+=(--platform "manylinux1_$arch")

echo "wheelhouse: resolving for Python $python_version on $platform: $(paste -sd' ' "$work/requirements.txt")"
python3 -m pip download -q --disable-pip-version-check --dest "$stage" \
    --only-binary=:all: --python-version "$python_version" --implementation cp \
    --abi "cp3$py_minor" --abi abi3 --abi none "${platforms[@]}" \
    -c "$work/constraints.txt" -r "$work/requirements.txt" 2> >(grep -v '^WARNING: Location' >&2) \
    || die "pip could not resolve the wheels (above); nothing was written to $dir" 1

for name in ${assume//,/ }; do
    norm=$(echo "$name" | tr 'A-Z-.' 'a-z__')
    found=$(cd "$stage" && ls | awk -v n="$norm" '{f = tolower($0); gsub(/[-.]/, "_", f)} index(f, n "_") == 1')
    [ -n "$found" ] && (cd "$stage" && rm -f $found) && echo "wheelhouse: left to the target: $found"
done

# the project's own wheel, built from the working tree's files (tracked and untracked, not ignored)
mkdir "$work/src"
(cd "$ROOT" && git ls-files -co --exclude-standard -z | while IFS= read -r -d '' f; do
    [ -f "$f" ] && printf '%s\0' "$f"; done | tar --null -T - -cf -) | tar -xf - -C "$work/src"
here_py=$(python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
here_glibc=$(python3 -c 'import platform; print(platform.libc_ver()[1].split(".")[1])')
if [ "$here_py" = "$python_version" ] && [ "$(uname -m)" = "$arch" ] && [ "$glibc_minor" -ge "$here_glibc" ]; then
    pure=0
else
    pure=1
fi
(cd "$work/src" && ARL_PURE_PYTHON=$pure python3 -m pip wheel -q --no-deps --no-build-isolation \
    --disable-pip-version-check -w "$stage" . >/dev/null) || die "building the project's wheel failed" 1
own=$(cd "$stage" && ls async_rl_orchestrator-*.whl)
if [ $pure = 1 ]; then
    echo "wheelhouse: $own is pure Python (target Python $python_version/$platform is not this machine's $here_py/glibc 2.$here_glibc/$(uname -m)): shm.ring runs its Python path"
elif python3 -m zipfile -l "$stage/$own" | grep -q '_ringfast'; then
    echo "wheelhouse: $own carries the C ring extension"
else
    echo "wheelhouse: $own has no C ring extension (no compiler here): shm.ring runs its Python path"
fi

check "$stage" "$dir"
mv "$stage"/* "$dir"/
echo "wheelhouse: wrote $dir (python $python_version, $platform; the target must already have torch${assume:+ and ${assume//,/, }})"
