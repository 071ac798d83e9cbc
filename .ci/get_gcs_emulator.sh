#!/usr/bin/env bash
# Install fake-gcs-server (a GCS JSON/XML API emulator written in Go) into the
# imagerecords cache so that the `gcs`-marked tests can run.
#
# Idempotent: does nothing when the pinned version is already installed. The binary is built in a
# staging folder and renamed into place, so a test run never starts a half-written one.
# Needs the Go toolchain (v1.56.x declares go 1.26; an older go fetches a
# newer toolchain itself when GOTOOLCHAIN allows it) and the Go module proxy.
#
# Usage:  .ci/get_gcs_emulator.sh            # installs the pinned version
#         FAKE_GCS_SERVER_VERSION=v1.x.y .ci/get_gcs_emulator.sh
# The binary ends up in ${IMAGERECORDS_CACHE:-$HOME/.cache/imagerecords}/bin,
# which is where tests/support/gcs.py looks for it.
set -euo pipefail

version="${FAKE_GCS_SERVER_VERSION:-v1.56.1}"
module="github.com/fsouza/fake-gcs-server"
bin_dir="${IMAGERECORDS_CACHE:-$HOME/.cache/imagerecords}/bin"
binary="$bin_dir/fake-gcs-server"

installed_version() {
  # `go version -m` prints the module path and version embedded in the binary.
  go version -m "$binary" 2>/dev/null | awk -v m="$module" '$1 == "mod" && $2 == m { print $3 }'
}

if ! command -v go >/dev/null 2>&1; then
  if [[ -x "$binary" ]]; then
    echo "go not found; keeping existing $binary" >&2
    exit 0
  fi
  echo "error: the Go toolchain is required to install fake-gcs-server" >&2
  exit 1
fi

if [[ -x "$binary" && "$(installed_version)" == "$version" ]]; then
  echo "fake-gcs-server $version already installed at $binary"
  exit 0
fi

mkdir -p "$bin_dir"
staging="$(mktemp -d "$bin_dir/.install.XXXXXX")"
trap 'rm -rf "$staging"' EXIT
echo "installing fake-gcs-server $version into $bin_dir ..."
GOBIN="$staging" GOFLAGS="${GOFLAGS:-} -trimpath" go install "$module@$version"
mv -f "$staging/fake-gcs-server" "$binary"
echo "installed: $(installed_version) at $binary"
