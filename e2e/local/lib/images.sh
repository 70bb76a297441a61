# Component `images`: the operator's and the workloads' container images in
# the node's containerd, under the names the operator runs by default
# (ghcr.io/flashsale-dev/NAME:VERSION), so a FlashSale needs no image override.
#
# `install images` builds the binaries (cargo, profile FLASHSALE_IMAGE_PROFILE,
# release by default) and the images with images/build, the script CI uses,
# from a Debian base made here with debootstrap; it saves each image to a
# tarball under $CACHE/images. `up images` imports them into containerd.
# Both steps key everything by content: an unchanged binary is neither built
# into an image nor imported again. Docker runs only while images are built:
# its own daemon, data under $CACHE/docker, socket under $STATE/docker,
# stopped again afterwards.
# shellcheck shell=bash

IMAGE_NAMES=(operator gateway inventory order-writer)
IMAGE_PROFILE=${FLASHSALE_IMAGE_PROFILE:-release}
# binutils: objcopy strips the staged binaries.
IMAGES_DEBIAN_PACKAGES=(docker.io debootstrap binutils)

images_build() { "$ROOT/images/build" --profile "$IMAGE_PROFILE" --context "$(images_context)" "$@"; }
images_context() { echo "$STATE/images/context-$IMAGE_PROFILE"; }
images_cache() { echo "$CACHE/images"; }
images_version() { "$ROOT/images/build" --version; }
docker_socket() { echo "$STATE/docker/docker.sock"; }
local_docker() { DOCKER_HOST="unix://$(docker_socket)" docker "$@"; }

images_progress() { log "images: $*"; }
# Milliseconds since $1 (a `date +%s%N`).
since_ms() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }

install_images() {
  [ "$(id -u)" = 0 ] || die "images: building needs root (dockerd, debootstrap)"
  install_debian_packages "${IMAGES_DEBIAN_PACKAGES[@]}"
  local t0 n tarball stale=()
  t0=$(date +%s%N)
  images_progress "building binaries ($IMAGE_PROFILE profile) and staging them"
  images_build --stage-only || die "building the binaries failed"
  images_progress "binaries staged in $(since_ms "$t0") ms"
  mkdir -p "$(images_cache)"
  for n in "${IMAGE_NAMES[@]}"; do
    tarball=$(image_tarball "$n") || die "images: $n was not staged"
    [ -f "$tarball" ] || stale+=("$n")
  done
  if [ ${#stale[@]} -eq 0 ]; then
    images_progress "all images up to date"
    return 0
  fi
  debian_base_tarball >/dev/null
  # A subshell, so dockerd is stopped however the build ends.
  ( trap stop_docker EXIT; build_images "${stale[@]}" ) || die "building images failed"
}

# --- keys --------------------------------------------------------------------

# An image is its staged binary, its Dockerfile, the base and the version;
# fails while the binary is not staged.
image_key() {
  local n=$1 bin
  bin=$(find "$(images_context)/$n" -maxdepth 1 -type f ! -name '.*' 2>/dev/null | head -n 1)
  [ -n "$bin" ] || return 1
  {
    sha256sum <"$bin"
    sha256sum <"$ROOT/$(image_dir "$n")/Dockerfile"
    debian_base_key
    images_version
  } | sha256sum | cut -c1-16
}
image_dir() { [ "$1" = operator ] && echo operator || echo "workloads/$1"; }
image_ref() { echo "ghcr.io/flashsale-dev/$1:$(images_version)"; }
# One per image and profile, so switching profiles back needs no rebuild.
image_tarball() { local key; key=$(image_key "$1") && echo "$(images_cache)/$1-$IMAGE_PROFILE-$key.tar"; }

# --- the Debian base ---------------------------------------------------------

# The packages every image needs at run time, from the Dockerfiles.
debian_base_packages() { "$ROOT/images/build" --packages; }
debian_base_key() {
  { echo "bookworm minbase v1"; debian_base_packages; } | sha256sum | cut -c1-12
}
debian_base_tag() { echo "flashsale-local/debian:bookworm-$(debian_base_key)"; }

# The Debian mirror this machine's apt uses (the first main archive in its
# sources), so the base comes from the same registry as every package.
debian_mirror() {
  local f uri=""
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    uri=$(awk '/^URIs:/ {for (i = 2; i <= NF; i++) if ($i !~ /security/) {print $i; exit}}' "$f")
    [ -n "$uri" ] && break
  done
  if [ -z "$uri" ] && [ -f /etc/apt/sources.list ]; then
    uri=$(awk '$1 == "deb" && $0 !~ /security/ {for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) {print $i; exit}}' \
      /etc/apt/sources.list)
  fi
  [ -n "$uri" ] || die "images: no Debian mirror found in the apt sources"
  echo "$uri"
}

# A minimal Debian 12 with the runtime packages, as a root filesystem
# tarball, cached by its package list. Documentation, manuals, locales and
# apt's lists are dropped (copyright files stay); /dev, /proc and /sys are
# left empty for the runtime to fill.
debian_base_tarball() {
  local out packages mirror t0
  out="$(images_cache)/debian-bookworm-$(debian_base_key).tar"
  if [ -f "$out" ]; then echo "$out"; return 0; fi
  packages=$(debian_base_packages)
  mirror=$(debian_mirror)
  t0=$(date +%s%N)
  images_progress "debootstrap of Debian bookworm with: $packages (about 2 minutes)"
  local tmp; tmp=$(mktemp -d "$(images_cache)/.debian-XXXXXX")
  debootstrap --variant=minbase --include="${packages// /,}" bookworm "$tmp/root" "$mirror" \
    >"$tmp/debootstrap.log" 2>&1 || { tail -n 20 "$tmp/debootstrap.log" >&2; rm -rf "$tmp"; die "debootstrap failed"; }
  local r="$tmp/root"
  rm -rf "$r"/var/cache/apt/archives/*.deb "$r"/var/cache/apt/*.bin "$r"/var/lib/apt/lists/* "$r"/usr/share/man/* "$r"/usr/share/info/* \
    "$r"/usr/share/locale/* "$r"/var/log/* "$r"/etc/hostname "$r"/etc/resolv.conf
  find "$r/usr/share/doc" -mindepth 1 ! -type d ! -name copyright -delete
  find "$r/usr/share/doc" -mindepth 1 -type d -empty -delete
  tar --numeric-owner -C "$r" --exclude='./dev/*' --exclude='./proc/*' --exclude='./sys/*' -cf "$tmp/base.tar" . \
    || { rm -rf "$tmp"; die "packing the Debian base failed"; }
  mv "$tmp/base.tar" "$out"
  rm -rf "$tmp"
  # Older bases (another package list) are not needed any more.
  find "$(images_cache)" -maxdepth 1 -name 'debian-bookworm-*.tar' ! -path "$out" -delete
  images_progress "Debian base ready in $(since_ms "$t0") ms"
  echo "$out"
}

# --- the Docker daemon, only while building ----------------------------------

start_docker() {
  live_pid docker >/dev/null && return 0
  local dir="$STATE/docker"
  mkdir -p "$dir" "$CACHE/docker"
  rm -f "$(docker_socket)"
  images_progress "starting dockerd (data in $CACHE/docker)"
  # For builds only: no bridge, no iptables rules, no masquerading, so the
  # daemon leaves the machine's (and the node's) network alone.
  start_process docker -- dockerd --data-root "$CACHE/docker" --exec-root "$dir/run" --pidfile "$dir/dockerd.pid" \
    -H "unix://$(docker_socket)" --bridge=none --iptables=false --ip6tables=false --ip-masq=false \
    --storage-driver=overlay2 --log-level=warn
  wait_ready docker 60 local_docker version
}
# dockerd leaves its network namespace bound under its exec root (and a
# daemon killed mid-build, its layers mounted); unmounted once it is gone, so
# nothing of it stays behind and `reset` can delete the state folder.
stop_docker() {
  local m
  stop_process docker
  for m in $(findmnt -rn -o TARGET | awk -v s="$STATE/docker/" -v c="$CACHE/docker/" \
      'index($0, s) == 1 || index($0, c) == 1' | sort -r); do
    umount "$m" 2>/dev/null || log "images: could not unmount $m"
  done
}

build_images() {
  local t0 n base
  start_docker
  base=$(debian_base_tag)
  if ! local_docker image inspect "$base" >/dev/null 2>&1; then
    t0=$(date +%s%N)
    images_progress "importing the Debian base as $base"
    local_docker import -c 'CMD ["/bin/bash"]' "$(debian_base_tarball)" "$base" >/dev/null \
      || die "docker import of the Debian base failed"
    images_progress "base imported in $(since_ms "$t0") ms"
  fi
  t0=$(date +%s%N)
  images_progress "docker build: $*"
  DOCKER_HOST="unix://$(docker_socket)" images_build --no-stage --base "$base" "$@" >/dev/null \
    || die "docker build failed"
  images_progress "built in $(since_ms "$t0") ms"
  for n in "$@"; do
    t0=$(date +%s%N)
    local out; out=$(image_tarball "$n") || die "images: $n was not staged"
    local_docker save -o "$out.tmp" "$(image_ref "$n")" || { rm -f "$out.tmp"; die "docker save of $n failed"; }
    mv "$out.tmp" "$out"
    find "$(images_cache)" -maxdepth 1 -name "$n-$IMAGE_PROFILE-*.tar" ! -path "$out" -delete
    images_progress "saved $(image_ref "$n") ($(( $(stat -c %s "$out") / 1048576 )) MB) in $(since_ms "$t0") ms"
  done
  # Layers of images replaced by this build.
  local_docker image prune -f >/dev/null || true
}

# --- containerd --------------------------------------------------------------

images_stamp() { echo "$STATE/images/$1.imported"; }

up_images() {
  declare -F ctr_k8s >/dev/null || die "images: ctr_k8s is missing (component containerd, lib/node.sh)"
  mkdir -p "$STATE/images"
  local n t0 tarball
  for n in "${IMAGE_NAMES[@]}"; do
    image_imported "$n" && continue
    tarball=$(image_tarball "$n") || die "images: $n was not built; run: e2e/local/stack install images"
    [ -f "$tarball" ] || die "images: $tarball is missing; run: e2e/local/stack install images"
    t0=$(date +%s%N)
    images_progress "importing $(image_ref "$n") into containerd"
    ctr_k8s images import "$tarball" >/dev/null || die "importing $(image_ref "$n") into containerd failed"
    # Pinned, so the kubelet's image garbage collection (under disk
    # pressure) leaves them: nothing could pull them back.
    ctr_k8s images label "$(image_ref "$n")" io.cri-containerd.pinned=pinned >/dev/null \
      || die "labelling $(image_ref "$n") in containerd failed"
    basename "$tarball" >"$(images_stamp "$n")"
    images_progress "imported $(image_ref "$n") in $(since_ms "$t0") ms"
  done
}

# Imported from the tarball of the current binary, and still in containerd.
image_imported() {
  local n=$1 tarball
  tarball=$(image_tarball "$n") || return 1
  [ "$(cat "$(images_stamp "$n")" 2>/dev/null)" = "$(basename "$tarball")" ] || return 1
  ctr_k8s images ls -q "name==$(image_ref "$n")" 2>/dev/null | grep -qxF "$(image_ref "$n")"
}

is_up_images() {
  declare -F ctr_k8s >/dev/null || return 1
  local n
  for n in "${IMAGE_NAMES[@]}"; do image_imported "$n" || return 1; done
}

address_images() { local IFS=,; echo "ghcr.io/flashsale-dev/{${IMAGE_NAMES[*]}}:$(images_version) ($IMAGE_PROFILE profile)"; }

# Images stay in containerd (they go with its state); a daemon left by an
# interrupted build is stopped.
down_images() { stop_docker; }
