#!/usr/bin/env bash
# The pip wheel, end to end: builds it (maturin, pyproject.toml at the repository root) into a
# temporary folder, installs it from that file alone into a fresh virtual environment, and runs
# the installed `gpukit` there: --version (must be the workspace's version), --help, check (on a
# machine without a GPU: the "No GPU available" line naming what to install, exit 0), and check
# from the environment without activating it (it must find a CUDA wheel's library in its own
# site-packages); then uninstalls it. It also reads the binary's glibc symbols and checks the
# wheel's manylinux tag says the same glibc. Exits 1 naming each check that failed.
#
#   scripts/wheel-check.sh [--profile NAME]   cargo profile of the binary (default: release;
#                                             also GPUKIT_WHEEL_PROFILE)
#
# maturin: the pinned version below, from PATH where it is that version, else installed from PyPI
# into a virtual environment under the cargo target directory (kept for the next run). The cargo
# build goes to $CARGO_TARGET_DIR (or target/), so an existing build of the profile is reused.
set -euo pipefail
cd "$(dirname "$0")/.."

MATURIN_VERSION=1.16.0
profile=${GPUKIT_WHEEL_PROFILE:-release}
while [ $# -gt 0 ]; do
  case "$1" in
    --profile) profile=${2:?--profile needs a name}; shift 2 ;;
    --profile=*) profile=${1#--profile=}; shift ;;
    -h | --help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "wheel-check: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
python=${PYTHON:-python3}
target_dir=${CARGO_TARGET_DIR:-$PWD/target}

failures=()
passed=0
fail() { echo "FAIL: $*"; failures+=("$*"); }
ok() { echo "ok:   $*"; passed=$((passed + 1)); }
# the output of a failed command, indented, at most 40 lines
show() { sed -n '1,40s/^/      | /p' "$1"; }

work=$(mktemp -d "${TMPDIR:-/tmp}/gpukit-wheel-check.XXXXXX")
work=$(cd "$work" && pwd -P)
trap 'rm -rf "$work"' EXIT

# The workspace's version: [workspace.package] version in Cargo.toml.
version=$(awk '
  /^\[/ { in_pkg = ($0 == "[workspace.package]") }
  in_pkg && /^version[ \t]*=/ { gsub(/.*=[ \t]*"|".*/, ""); print; exit }
' Cargo.toml)
if [ -z "$version" ]; then
  echo "wheel-check: no [workspace.package] version in Cargo.toml" >&2
  exit 1
fi
echo "workspace version $version; cargo profile $profile"

# maturin
maturin=""
if command -v maturin >/dev/null 2>&1 && [ "$(maturin --version 2>/dev/null)" = "maturin $MATURIN_VERSION" ]; then
  maturin=$(command -v maturin)
else
  tools="$target_dir/wheel-tools"
  if [ "$("$tools/bin/maturin" --version 2>/dev/null)" != "maturin $MATURIN_VERSION" ]; then
    echo "installing maturin $MATURIN_VERSION into $tools"
    rm -rf "$tools"
    if ! { "$python" -m venv "$tools" \
      && "$tools/bin/pip" install --quiet --disable-pip-version-check "maturin==$MATURIN_VERSION"; } \
      >"$work/maturin-install.log" 2>&1; then
      show "$work/maturin-install.log"
      echo "FAIL: could not install maturin $MATURIN_VERSION from PyPI"
      exit 1
    fi
  fi
  maturin="$tools/bin/maturin"
fi
echo "using $("$maturin" --version) ($maturin)"

# 1. Build the wheel.
start=$(date +%s)
if ! "$maturin" build --locked --profile "$profile" --out "$work/dist" >"$work/build.log" 2>&1; then
  tail -n 40 "$work/build.log" | sed 's/^/      | /'
  echo "FAIL: maturin build --profile $profile"
  exit 1
fi
echo "built in $(($(date +%s) - start)) s: $(grep -m 1 -o 'Finished .*' "$work/build.log" || echo 'no cargo summary')"
shopt -s nullglob
wheels=("$work"/dist/*.whl)
shopt -u nullglob
if [ "${#wheels[@]}" -ne 1 ]; then
  echo "FAIL: expected one wheel in the build's output, found ${#wheels[@]}"
  exit 1
fi
wheel=${wheels[0]}
name=$(basename "$wheel")
echo "wheel: $name ($(du -k "$wheel" | cut -f1) KiB)"

# 2. Its name: gpukit, the workspace's version, any Python 3, a manylinux tag of this machine.
arch=$(uname -m)
tag_re="^gpukit-${version//./\\.}-py3-none-manylinux_2_([0-9]+)_${arch}\.whl$"
if [[ "$name" =~ $tag_re ]]; then
  tag_glibc_minor=${BASH_REMATCH[1]}
  ok "wheel name: gpukit $version, py3-none, manylinux_2_${tag_glibc_minor}_${arch}"
else
  tag_glibc_minor=""
  fail "wheel name $name is not gpukit-$version-py3-none-manylinux_2_N_$arch.whl"
fi

# 3. The tag is honest: the newest glibc symbol version the binary needs is the tag's glibc.
"$python" - "$wheel" "$work/gpukit.bin" <<'EOF'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    names = [n for n in z.namelist() if n.endswith(".data/scripts/gpukit")]
    if len(names) != 1:
        sys.exit(f"the wheel holds {names or 'no'} .data/scripts/gpukit")
    open(sys.argv[2], "wb").write(z.read(names[0]))
EOF
if ! command -v objdump >/dev/null 2>&1; then
  echo "note: objdump not found (binutils); the glibc the binary needs was not read"
elif [ -n "$tag_glibc_minor" ]; then
  need=$(objdump -T "$work/gpukit.bin" | grep -o 'GLIBC_2\.[0-9]*' | sort -t. -k2,2n -u | tail -n 1)
  if [ "$need" = "GLIBC_2.$tag_glibc_minor" ]; then
    ok "glibc: the binary needs $need at most; the tag says manylinux_2_$tag_glibc_minor"
  else
    fail "glibc: the binary needs ${need:-no versioned glibc symbol}, the tag says manylinux_2_$tag_glibc_minor"
  fi
fi

# 4. Install it into a fresh virtual environment from the file only.
venv="$work/venv"
"$python" -m venv "$venv"
if PIP_FIND_LINKS="" "$venv/bin/pip" install --no-index --quiet --disable-pip-version-check \
  "$wheel" >"$work/install.log" 2>&1; then
  ok "pip install --no-index $name into a fresh venv"
else
  show "$work/install.log"
  fail "pip install --no-index $name"
fi
# The installed command, as an activated environment sees it; its cache in the temporary folder.
run() {
  env HOME="$work/home" XDG_CACHE_HOME="$work/cache" VIRTUAL_ENV="$venv" PATH="$venv/bin:$PATH" "$@"
}
where=$(run sh -c 'command -v gpukit' || true)
if [ "$where" = "$venv/bin/gpukit" ]; then
  ok "gpukit on the venv's PATH: $where"
else
  fail "gpukit on the venv's PATH is '${where:-nothing}', not $venv/bin/gpukit"
fi

# 5. gpukit --version says the workspace's version.
if out=$(run gpukit --version 2>&1); then
  got=$(echo "$out" | head -n 1 | awk '{print $2}')
  if [ "$(echo "$out" | head -n 1 | awk '{print $1}')" = gpukit ] && [ "$got" = "$version" ]; then
    ok "gpukit --version: $(echo "$out" | head -n 1)"
  else
    fail "gpukit --version says '$out', not gpukit $version"
  fi
else
  fail "gpukit --version exited $?: $out"
fi

# 6. gpukit --help.
if run gpukit --help >"$work/help.txt" 2>&1 && grep -q '^Usage: gpukit' "$work/help.txt" \
  && grep -q '^  check' "$work/help.txt"; then
  ok "gpukit --help: usage and the commands"
else
  show "$work/help.txt"
  fail "gpukit --help: no usage line or no commands"
fi

# 7. gpukit check: exit 0 with or without a GPU; without one, its line names what to install.
rc=0
run gpukit check >"$work/check.txt" 2>&1 || rc=$?
if [ "$rc" -ne 0 ]; then
  show "$work/check.txt"
  fail "gpukit check exited $rc (0 expected, with or without a GPU)"
elif grep -q '^No GPU available: .*install the NVIDIA driver' "$work/check.txt"; then
  ok "gpukit check (exit 0): $(grep -m 1 '^No GPU available' "$work/check.txt")"
elif grep -q '^GPU available: ' "$work/check.txt"; then
  ok "gpukit check (exit 0), a GPU is here: $(grep -m 1 '^GPU available' "$work/check.txt")"
else
  show "$work/check.txt"
  fail "gpukit check: neither a 'No GPU available: ... install the NVIDIA driver' line nor a GPU"
fi

# 8. From the environment without activating it (no VIRTUAL_ENV, not on PATH, no other CUDA
# setting), gpukit finds a CUDA wheel's library in its own site-packages. The library is an empty
# file: `check --quick` reports where libraries are without opening them.
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
mkdir -p "$site/nvidia/cudnn/lib"
: >"$site/nvidia/cudnn/lib/libcudnn.so.9"
rc=0
env -i HOME="$work/home" XDG_CACHE_HOME="$work/cache" PATH=/usr/bin:/bin \
  "$venv/bin/gpukit" check --quick --json >"$work/check.json" 2>"$work/check.err" || rc=$?
found=$("$python" - "$work/check.json" <<'EOF' 2>&1 || true
import json, sys
doc = json.load(open(sys.argv[1]))
lib = next(l for l in doc["result"]["libraries"] if l["library"] == "cudnn")
print(f'{lib["source"]} {lib["path"]}' if lib["found"] else "not found")
EOF
)
if [ "$rc" -eq 0 ] && [ "$found" = "python_wheels $site/nvidia/cudnn/lib/libcudnn.so.9" ]; then
  ok "not activated, gpukit check found its own environment's nvidia/cudnn/lib/libcudnn.so.9"
else
  show "$work/check.err"
  fail "not activated, gpukit check --quick --json (exit $rc) found cuDNN at: $found"
fi
rm -rf "$site/nvidia"

# 9. Uninstall.
if "$venv/bin/pip" uninstall --yes --quiet --disable-pip-version-check gpukit >"$work/uninstall.log" 2>&1 \
  && [ ! -e "$venv/bin/gpukit" ]; then
  ok "pip uninstall gpukit: $venv/bin/gpukit is gone"
else
  show "$work/uninstall.log"
  fail "pip uninstall gpukit"
fi

if [ "${#failures[@]}" -gt 0 ]; then
  echo "failed:"
  printf '  - %s\n' "${failures[@]}"
fi
echo "wheel-check: $passed passed, ${#failures[@]} failed"
[ "${#failures[@]}" -eq 0 ]
