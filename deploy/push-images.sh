#!/usr/bin/env bash
# Push the deepres images to the registry the admin names, under the names the chart pulls with
# `--set imageRegistry=REGISTRY`: REGISTRY/deepres/extender:VERSION and REGISTRY/deepres/agent:VERSION
# (VERSION: pyproject.toml's, the chart's appVersion). The images are the ones `make images` built
# (localhost/deepres/{extender,agent}:VERSION); pushed with buildah, podman or docker, the first found
# (TOOL=... picks one). Log in first (`buildah login REGISTRY`, or podman's, docker's).
#   make push-images REGISTRY=registry.example.com/ml
#   bash deploy/push-images.sh [--dry-run] REGISTRY      # --dry-run: print what would be pushed, push nothing
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { echo "usage: bash deploy/push-images.sh [--dry-run] REGISTRY   (or: make push-images REGISTRY=...)" >&2; }
die() { echo "push-images: $*" >&2; exit 2; }

dry=0
if [[ "${1:-}" == "--dry-run" ]]; then dry=1; shift; fi
[[ $# -le 1 ]] || { usage; exit 2; }
registry=${1:-}
if [[ -z "$registry" ]]; then
    usage
    die "name the registry your nodes pull from, e.g. REGISTRY=registry.example.com/ml"
fi
[[ "$registry" != *"://"* ]] || die "REGISTRY is a host and path (registry.example.com/ml), not a URL: got '$registry'"
[[ "$registry" != *" "* ]] || die "REGISTRY has a space in it: '$registry'"
registry=${registry%/}

# the project's version (pyproject.toml's [project] version, the chart's appVersion): the images' tag
version=$(sed -n '/^\[project\]/,/^\[/s/^version = "\(.*\)"$/\1/p' pyproject.toml)
[[ -n "$version" ]] || die "no version in pyproject.toml's [project] table"

tool=${TOOL:-}
if [[ -z "$tool" ]]; then
    for candidate in buildah podman docker; do
        if command -v "$candidate" >/dev/null 2>&1; then tool=$candidate; break; fi
    done
fi
if [[ -z "$tool" ]]; then
    ((dry)) || die "none of buildah, podman or docker is on PATH: install one (make images installs buildah)"
    tool=none
elif ! command -v "$tool" >/dev/null 2>&1; then
    die "TOOL=$tool is not on PATH"
fi

for kind in extender agent; do
    source="localhost/deepres/$kind:$version"
    target="$registry/deepres/$kind:$version"
    if ((dry)); then
        echo "$source -> $target"
        continue
    fi
    case "$tool" in
        buildah|podman)
            "$tool" inspect --type image "$source" >/dev/null 2>&1 \
                || die "$tool has no image $source: run 'make images' first"
            echo "push-images: $tool push $source docker://$target" >&2
            "$tool" push "$source" "docker://$target"
            ;;
        docker)
            docker info >/dev/null 2>&1 || die "docker cannot reach its daemon (docker info fails): start it, or TOOL=buildah"
            docker image inspect "$source" >/dev/null 2>&1 || die "docker has no image $source: build it with
  docker build -f deploy/Dockerfile.$kind -t $source .
(or 'make images', which builds with buildah)"
            docker tag "$source" "$target"
            echo "push-images: docker push $target" >&2
            docker push "$target"
            ;;
        *) die "TOOL must be buildah, podman or docker, got '$tool'" ;;
    esac
done
((dry)) || echo "push-images: done; install with: helm install deepres ./helm/deepres --namespace deepres --create-namespace --set imageRegistry=$registry" >&2
