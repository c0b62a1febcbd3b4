# Shared by scripts/pg-cluster.sh and scripts/redis-cluster.sh (sourced, not run): the caller sets
# `name` (its prefix in messages) and `dir` (where its logs are).

# apt_install PACKAGE...: installs the packages from Debian's archive.
apt_install() {
    echo "$name: installing $* from Debian's packages"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# wait_for SECONDS DESCRIPTION COMMAND...: polls COMMAND every 0.1 s until it succeeds.
wait_for() {
    local seconds=$1 what=$2
    shift 2
    for _ in $(seq 1 $((seconds * 10))); do
        if "$@" >/dev/null 2>&1; then return 0; fi
        sleep 0.1
    done
    echo "$name: $what did not happen within ${seconds}s; logs in $dir" >&2
    return 1
}
