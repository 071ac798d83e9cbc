#!/usr/bin/env bash
# Build Apache Beam's Prism runner (a Go program) into the imagerecords cache so that tests and the
# newest-Beam CI stage can pass it to Beam as --runner PrismRunner --prism_location BIN.
#
# The version follows the apache-beam of $PYTHON (Prism and the Python SDK speak the same job API
# only at the same release), or PRISM_VERSION when set. Idempotent: does nothing when that version
# is already installed. A lock file keeps two runs from building at once; the binary is built in a
# staging folder and renamed into place, so a test never starts a half-written one.
# Needs the Go toolchain and the Go module proxy (the first build takes minutes).
#
# Usage:  .ci/get_prism.sh                       # the version of the installed apache-beam
#         PYTHON=/path/to/venv/bin/python .ci/get_prism.sh
#         PRISM_VERSION=2.77.0 .ci/get_prism.sh
# The binary ends up in ${IMAGERECORDS_CACHE:-$HOME/.cache/imagerecords}/bin/prism-<version>
# (one per Beam release, as CI's two environments use two), which is where tests/support/prism.py
# looks for it; the last line printed is its path.
set -euo pipefail

module="github.com/apache/beam/sdks/v2"
bin_dir="${IMAGERECORDS_CACHE:-$HOME/.cache/imagerecords}/bin"

fail() { echo "get_prism: $*" >&2; exit 1; }

version="${PRISM_VERSION:-}"
if [[ -z "$version" ]]; then
  python="${PYTHON:-python3}"
  version="$("$python" -c 'import apache_beam; print(apache_beam.__version__)' 2>/dev/null)" \
    || fail "apache-beam is not importable by $python; set PYTHON or PRISM_VERSION"
fi
version="${version#v}"
[[ "$version" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || fail "not a Beam release version: '$version'"
binary="$bin_dir/prism-$version"

installed_version() {
  # `go version -m` prints the main module's version embedded in the binary.
  go version -m "$binary" 2>/dev/null | awk -v m="$module" '$1 == "mod" && $2 == m { print $3 }'
}

if ! command -v go >/dev/null 2>&1; then
  [[ -x "$binary" ]] && { echo "$binary"; exit 0; }
  fail "the Go toolchain is required to build Prism $version"
fi

mkdir -p "$bin_dir"
exec 9>"$bin_dir/.prism.lock"
flock 9   # a second run waits here, then finds the binary the first one built
if [[ -x "$binary" && "$(installed_version)" == "v$version" ]]; then
  echo "get_prism: Prism v$version already installed" >&2
  echo "$binary"
  exit 0
fi

staging="$(mktemp -d "$bin_dir/.prism.XXXXXX")"
trap 'rm -rf "$staging"' EXIT
echo "get_prism: building Prism v$version into $bin_dir (minutes on a first run) ..." >&2
log="$staging/go-install.log"
GOBIN="$staging" GOFLAGS="${GOFLAGS:-} -trimpath" go install "$module/go/cmd/prism@v$version" >"$log" 2>&1 \
  || fail "go install $module/go/cmd/prism@v$version failed: $(tail -1 "$log")"
mv -f "$staging/prism" "$binary"
echo "get_prism: installed Prism $(installed_version)" >&2
echo "$binary"
