#!/usr/bin/env bash
# Every install the docs tell a user to run, each in a fresh virtualenv with exactly those
# extras (no --system-site-packages: that would hide a missing dependency), from a fresh copy
# of the tree, then a smoke check of the commands that install is for (.ci/install_smoke.py,
# run by CI's own python, which has the test extras: the openai SDK, the PostgreSQL helper).
# Two jobs run at once (FLOWTRIAL_MATRIX_JOBS); pip's cache (PIP_CACHE_DIR) keeps the downloads to the first run.
# Usage: bash .ci/install_matrix.sh [job ...]   (default: all jobs)
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
python="${PYTHON:-python3}"
export PIP_CACHE_DIR="${PIP_CACHE_DIR:-$HOME/.cache/pip}" PIP_DISABLE_PIP_VERSION_CHECK=1

# job  extras  (where the docs say it)
declare -A EXTRAS=(
  [demo]=demo                 # README, docs/researchers/demo.md
  [study]=proxy,analysis      # README: a study in five commands
  [dashboard]=dashboard       # README, docs/researchers/running.md
  [notebooks]=notebooks       # README, docs/researchers/report.md
  [postgres]=postgres         # docs/operators/postgresql.md
  [telemetry]=telemetry       # docs/clients/telemetry.md
)
jobs=("$@")
[ "${#jobs[@]}" -gt 0 ] || jobs=(demo study dashboard notebooks postgres telemetry)

root=$(mktemp -d "${TMPDIR:-/tmp}/flowtrial-installs.XXXXXX")
chmod 755 "$root"
trap 'rm -rf "$root"' EXIT

one() {  # one job: copy the tree, make the venv, install, smoke; its log in $root/$1.log
  local job=$1 dir=$root/$1 start=$SECONDS
  mkdir -p "$dir/src"
  { git -C "$repo" ls-files -z --cached --others --exclude-standard \
      | (cd "$repo" && tar --null -T - -cf -) | tar -xf - -C "$dir/src"
    "$python" -m venv "$dir/venv"
    # --no-compile: modules compile when first imported (most of SciPy, pandas never are)
    "$dir/venv/bin/python" -m pip install --quiet --no-compile -e "$dir/src[${EXTRAS[$job]}]"
    echo "$((SECONDS - start))" >"$dir/installed_after"
    "$python" "$repo/.ci/install_smoke.py" "$job" "$dir/venv" "$dir/src"
  } >"$root/$job.log" 2>&1 && status=ok || status=FAILED
  echo "install [$job] pip install -e '.[${EXTRAS[$job]}]': $status in $((SECONDS - start)) s" \
       "(installed after $(cat "$dir/installed_after" 2>/dev/null || echo '?') s)"
  if [ "$status" != ok ]; then tail -n 60 "$root/$job.log"; return 1; fi
}
export -f one
export root repo python
export EXTRAS_DECL="$(declare -p EXTRAS)"

started=$SECONDS
if printf '%s\n' "${jobs[@]}" | xargs -P "${FLOWTRIAL_MATRIX_JOBS:-2}" -I{} \
    bash -c 'eval "$EXTRAS_DECL"; one {}'; then
  echo "install matrix: ${#jobs[@]} installs passed in $((SECONDS - started)) s"
else
  echo "install matrix: FAILED (after $((SECONDS - started)) s)" >&2
  exit 1
fi
