#!/usr/bin/env bash
# scripts/get_mnist.sh — fetch the four canonical MNIST files into $MIXTAPE_MNIST_DIR (default ./data/mnist).
#
# Each file is downloaded from the first public mirror that answers, to a temporary name in the target directory,
# checked against its published MD5, and only then renamed into place: an interrupted or corrupt download never
# leaves a file that looks like MNIST. Files already present with the right MD5 are kept. Offline, it says so in
# one line and falls back to Debian's Fashion-MNIST (same file format; mixtape's find_mnist looks there last).
#
#   scripts/get_mnist.sh                              # into ./data/mnist
#   MIXTAPE_MNIST_DIR=$HOME/mnist scripts/get_mnist.sh
#   MIXTAPE_MNIST_MIRRORS="https://mirror.example/mnist/ file:///srv/mnist/" scripts/get_mnist.sh
#                                                     # other mirrors, tried in order (base URLs, curl's schemes)
set -euo pipefail

dir="${MIXTAPE_MNIST_DIR:-./data/mnist}"
debian_dir=/usr/share/datasets/fashion-mnist
mirrors=(https://ossci-datasets.s3.amazonaws.com/mnist/
         https://storage.googleapis.com/cvdf-datasets/mnist/
         http://yann.lecun.com/exdb/mnist/)
if [[ -n "${MIXTAPE_MNIST_MIRRORS:-}" ]]; then
  read -r -a mirrors <<<"$MIXTAPE_MNIST_MIRRORS"
fi
files=(train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz)
declare -A md5=([train-images-idx3-ubyte.gz]=f68b3c2dcbeaaa9fbdd348bbdeb94873
                [train-labels-idx1-ubyte.gz]=d53e105ee54ea40749a09fcbcd1e9432
                [t10k-images-idx3-ubyte.gz]=9fb629c4189551a2d022fa330f9573f3
                [t10k-labels-idx1-ubyte.gz]=ec29112dd5afa0611ce80d1b7f02629c)

say() { echo "get_mnist: $*"; }
md5_of() { md5sum "$1" | cut -d' ' -f1; }

tmp=""
cleanup() { [[ -n "$tmp" ]] && rm -f -- "$tmp"; return 0; }
trap cleanup EXIT
trap 'exit 130' INT TERM

have_debian_fashion() {
  local f
  for f in "${files[@]}"; do [[ -f "$debian_dir/$f" || -f "$debian_dir/${f%.gz}" ]] || return 1; done
}

fall_back_to_fashion() {
  if have_debian_fashion; then
    :
  elif [[ $(id -u) -eq 0 ]]; then
    say "installing Debian's Fashion-MNIST: apt-get install -y dataset-fashion-mnist"
    local log
    if ! log=$(DEBIAN_FRONTEND=noninteractive apt-get install -y dataset-fashion-mnist 2>&1); then
      echo "$log" | tail -n 5 >&2
      say "apt-get install -y dataset-fashion-mnist failed: no dataset available" >&2
      exit 1
    fi
  else
    say "no dataset available; as root run: apt-get install -y dataset-fashion-mnist (or: sudo apt-get install -y dataset-fashion-mnist)" >&2
    exit 1
  fi
  if ! have_debian_fashion; then
    say "dataset-fashion-mnist is installed but $debian_dir lacks the four IDX files" >&2
    exit 1
  fi
  say "dataset: Fashion-MNIST in $debian_dir (found by mixtape::data::find_mnist() when no MNIST is present)"
  exit 0
}

file_mode=$(printf '%o' $(( 0666 & ~0$(umask) )))
command -v curl >/dev/null || { say "curl is not installed (apt-get install -y curl)" >&2; exit 1; }
mkdir -p -- "$dir"
# Temporary files a killed run left (SIGKILL, power loss). A live download's was created less than 10 minutes ago
# (curl's --max-time ends it then) and last written since; one last written 15 minutes ago is a dead run's.
find "$dir" -maxdepth 1 -type f -name '.*-ubyte.gz.part.*' -mmin +15 -delete

for f in "${files[@]}"; do
  if [[ -f "$dir/$f" ]]; then
    if [[ $(md5_of "$dir/$f") == "${md5[$f]}" ]]; then
      say "$f: present, MD5 ok"
      continue
    fi
    say "$f: present but its MD5 is wrong; downloading it again"
  fi
  got=0
  reached=0
  for m in "${mirrors[@]}"; do
    tmp=$(mktemp "$dir/.$f.part.XXXXXX")
    if curl -fsSL --connect-timeout 10 --max-time 600 -o "$tmp" "$m$f" 2>/dev/null; then
      reached=1
      if [[ $(md5_of "$tmp") == "${md5[$f]}" ]]; then
        chmod "$file_mode" -- "$tmp"  # mktemp made it 0600; the data is for every user the umask allows
        mv -f -- "$tmp" "$dir/$f"
        tmp=""
        say "$f: downloaded from $m, MD5 ok"
        got=1
        break
      fi
      say "$f from $m: MD5 mismatch (got $(md5_of "$tmp")); trying the next mirror" >&2
    fi
    rm -f -- "$tmp"
    tmp=""
  done
  if [[ $got -eq 0 ]]; then
    if [[ $reached -eq 0 ]]; then
      say "offline (no MNIST mirror reachable); falling back to Debian's Fashion-MNIST (dataset-fashion-mnist)"
    else
      say "$f: no mirror served a file with the published MD5; falling back to Debian's Fashion-MNIST" >&2
    fi
    fall_back_to_fashion
  fi
done

if [[ "$dir" == ./data/mnist ]]; then
  say "dataset: MNIST in $dir"
else
  say "dataset: MNIST in $dir (build/examples/mnist finds it with MIXTAPE_MNIST_DIR=$dir exported, or --data $dir)"
fi
