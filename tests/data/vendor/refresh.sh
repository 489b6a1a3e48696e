#!/usr/bin/env bash
# Refresh a vendored upstream tree under tests/data/vendor/ from a git directory (bare or a
# clone's work tree) or a remote URL, at one commit; writes the files, the upstream LICENSE and
# SOURCE.md (repository, paths, commit). The tests read only these copies.
#
#   tests/data/vendor/refresh.sh lws              SOURCE COMMIT
#   tests/data/vendor/refresh.sh production-stack SOURCE COMMIT
#
# SOURCE: e.g. ~/src/lws, or https://github.com/kubernetes-sigs/lws.git (fetched at COMMIT only).
set -euo pipefail

usage() { echo "usage: $0 lws|production-stack SOURCE COMMIT" >&2; exit 64; }
[ $# -eq 3 ] || usage
name=$1 source=$2 commit=$3
here=$(cd "$(dirname "$0")" && pwd)

case $name in
  lws)
    repo=https://github.com/kubernetes-sigs/lws
    paths=(LICENSE config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml)
    what="The LeaderWorkerSet CRD, which tests/deploy/lws.py validates renderings against"
    ;;
  production-stack)
    repo=https://github.com/vllm-project/production-stack
    # What `helm template` reads of the chart; not its unit tests, examples or README.
    paths=(LICENSE helm/Chart.yaml helm/Chart.lock helm/values.yaml helm/values.schema.json
           helm/.helmignore helm/templates helm/crds helm/dashboards)
    what="The vllm-stack Helm chart, which tests/deploy/manifests.py renders under the post-renderer"
    ;;
  *) usage ;;
esac

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [ -d "$source" ]; then
  git_dir=$(git -C "$source" rev-parse --absolute-git-dir 2>/dev/null || echo "$source")
else
  git_dir=$work/git
  git init -q --bare "$git_dir"
  git --git-dir="$git_dir" fetch -q --depth 1 "$source" "$commit"
fi
full=$(git --git-dir="$git_dir" rev-parse --verify "$commit^{commit}")

dest=$here/$name
rm -rf "$dest"
mkdir -p "$dest"
# File by file (not `git archive`, which reads the whole tree: a mirror may lack other blobs).
git --git-dir="$git_dir" ls-tree -r --name-only "$full" -- "${paths[@]}" | while read -r file; do
  mkdir -p "$dest/$(dirname "$file")"
  git --git-dir="$git_dir" cat-file blob "$full:$file" >"$dest/$file"
done

{
  echo "# $name, vendored"
  echo
  echo "$what."
  echo
  echo "- Repository: $repo"
  echo "- Commit: $full"
  echo "- Paths (verbatim, at that commit):"
  for p in "${paths[@]}"; do echo "  - \`$p\`"; done
  echo "- License: Apache-2.0 (LICENSE, copied from the repository)"
  echo
  echo "Refresh: \`tests/data/vendor/refresh.sh $name SOURCE COMMIT\` (SOURCE: a git directory or"
  echo "the repository's URL)."
} >"$dest/SOURCE.md"
echo "$name: $full -> ${dest#"$here"/}"
