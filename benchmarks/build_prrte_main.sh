#!/bin/sh
# Build PMIx and PRRTE from their main branches into ~/.cache/collectives/prrte-main: a launcher
# whose runtime survives a lost daemon (openpmix/prrte#2443), for Open MPI 5.0.11's ranks from
# PyPI under ULFM (docs/clusters.md, "A lost daemon: PRRTE's main branch").
#
#   benchmarks/build_prrte_main.sh OPENPMIX_GIT PRRTE_GIT OAC_GIT
#
# Each argument is a git repository to clone (a URL, or a local copy such as a mirror of
# github.com/openpmix/openpmix, github.com/openpmix/prrte and github.com/open-mpi/oac, the
# config/oac submodule both use). The commits built are the ones tried here, unless
# PMIX_COMMIT, PRRTE_COMMIT or OAC_COMMIT name others ("HEAD": the clone's newest).
# PREFIX (default ~/.cache/collectives/prrte-main) gets the installation, WORK (default
# ~/.cache/collectives/prrte-main-build) the sources, build folders and logs. Needs a C compiler,
# autoconf, automake, libtool, flex, libevent and hwloc headers, zlib (Debian: apt-get install
# autoconf automake libtool flex libevent-dev libhwloc-dev zlib1g-dev). About 5 minutes on 2
# cores; on a shared machine run it under the machine's lock:
#   flock /work/machine.lock nice -n 19 benchmarks/build_prrte_main.sh ...
# The last step writes PREFIX/collectives-ready, naming the commits; tests look for it.
set -eu
[ $# -eq 3 ] || { sed -n '2,19p' "$0" >&2; exit 2; }
PMIX_GIT=$1 PRRTE_GIT=$2 OAC_GIT=$3
PMIX_COMMIT=${PMIX_COMMIT:-494e9d9d03659ac99a4520492d26b8c33d67d9d4}    # 2026-08-21, PMIx 7.0.0a1
PRRTE_COMMIT=${PRRTE_COMMIT:-52d5e4bb1fb6dab9c46636a797605b9629581cd6}  # 2026-08-22, PRRTE 5.0.0a1
OAC_COMMIT=${OAC_COMMIT:-3064f7bd191b49a5a5554170ef7be4762246b5ee}      # 2025-06-03
PREFIX=${PREFIX:-$HOME/.cache/collectives/prrte-main}
WORK=${WORK:-$HOME/.cache/collectives/prrte-main-build}
JOBS=${JOBS:-2}

rm -rf "$WORK/src" "$WORK/build" "$PREFIX"
mkdir -p "$WORK/src" "$WORK/build/openpmix" "$WORK/build/prrte"
log() { echo "build_prrte_main: $*"; }

fetch() {  # fetch NAME GIT COMMIT: a clone at COMMIT, with config/oac at OAC_COMMIT
    git clone -q "$2" "$WORK/src/$1"
    git -C "$WORK/src/$1" -c advice.detachedHead=false checkout -q "$3"
    rm -rf "$WORK/src/$1/config/oac"
    git clone -q "$OAC_GIT" "$WORK/src/$1/config/oac"
    git -C "$WORK/src/$1/config/oac" -c advice.detachedHead=false checkout -q "$OAC_COMMIT"
    # autogen.pl refuses an uninitialized submodule; another oac commit than the pinned one only warns
    git -C "$WORK/src/$1" submodule init -q
    log "$1 at $(git -C "$WORK/src/$1" rev-parse HEAD), oac at $(git -C "$WORK/src/$1/config/oac" rev-parse HEAD)"
}

build() {  # build NAME CONFIGURE-OPTIONS...
    name=$1; shift
    src="$WORK/src/$name"
    (cd "$src" && ./autogen.pl) > "$WORK/autogen-$name.log" 2>&1
    cd "$WORK/build/$name"
    "$src/configure" --prefix="$PREFIX" --disable-man-pages "$@" > "$WORK/configure-$name.log" 2>&1
    make -j"$JOBS" > "$WORK/make-$name.log" 2>&1
    make install > "$WORK/install-$name.log" 2>&1
    log "$name installed in $PREFIX (logs in $WORK)"
}

fetch openpmix "$PMIX_GIT" "$PMIX_COMMIT"
fetch prrte "$PRRTE_GIT" "$PRRTE_COMMIT"
build openpmix --with-libevent --with-hwloc
build prrte --with-pmix="$PREFIX"
{
    echo "openpmix $(git -C "$WORK/src/openpmix" rev-parse HEAD)"
    echo "prrte $(git -C "$WORK/src/prrte" rev-parse HEAD)"
    echo "oac $(git -C "$WORK/src/prrte/config/oac" rev-parse HEAD)"
    "$PREFIX/bin/prte_info" | sed -n 's/^ *\(PRRTE\|PRRTE repo revision\): /prte_info \1: /p'
} > "$PREFIX/collectives-ready"
cat "$PREFIX/collectives-ready"
