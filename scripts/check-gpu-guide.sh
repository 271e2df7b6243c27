#!/usr/bin/env bash
# Runs docs/first-gpu-host.md: every ```sh block of the guide is preceded by a
# marker, either <!-- check: run --> or <!-- check: skip: REASON -->, and this
# script runs each "run" block, in order, as the guide's reader would, except:
#
# - in a temporary root: absolute paths under /etc, /usr, /srv, /var and /opt
#   in a block are moved under it, and the blocks run in a copy of the
#   repository, so nothing is written outside a temporary directory (but the
#   Go build cache);
# - vLLM is the bundled simulator: ROOT/opt/vllm/bin/vllm drops "serve" and
#   execs the installed poold's engine-sim;
# - systemctl, journalctl, runuser, systemd-sysusers and systemd-tmpfiles are
#   stand-ins (written below) that never reach the host's systemd:
#   `systemctl daemon-reload` verifies the installed units and their drop-ins
#   with systemd-analyze; `systemctl start` (and `enable --now`) runs the
#   unit's ExecStartPre and ExecStart with its environment, as systemd would,
#   and waits until poold listens; journalctl prints poold's log; runuser
#   runs its command as the current user; sysusers and tmpfiles run for real
#   with --root.
#
# At the end, every file that an installed unit's Documentation= names must
# exist in the root. Needs root (tmpfiles sets owners), curl, systemd-analyze,
# systemd-sysusers and systemd-tmpfiles.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
guide=$repo/docs/first-gpu-host.md

# Under /tmp, which no path that the blocks name begins with.
tmp=$(mktemp -d /tmp/poold-guide.XXXXXX)
root=$tmp/root
state=$tmp/state # the stand-ins' own files: poold's pid and log
cleanup() {
  # poold, if a block left it running, stops; it leaves its engines running
  # for the next poold (keep-engines-on-restart), and stop-engines stops them.
  [ -x "$tmp/bin/systemctl" ] && "$tmp/bin/systemctl" stop poold 2>/dev/null
  [ -x "$root/usr/local/bin/poold" ] && "$root/usr/local/bin/poold" stop-engines --state-dir "$root/var/lib/poold" >/dev/null 2>&1
  rm -rf "$tmp"
}
trap cleanup EXIT
mkdir -p "$state" "$tmp/bin" "$tmp/src" "$tmp/blocks"

# The blocks, as files 01.run, 02.skip…; a skip file holds its reason.
awk -v dir="$tmp/blocks" '
  function fail(msg) { print "docs/first-gpu-host.md:" NR ": " msg > "/dev/stderr"; bad = 1; exit 1 }
  /^<!-- check: / {
    if (marker != "") fail("marker without a ```sh block")
    marker = $0; next
  }
  /^```sh$/ {
    if (marker == "") fail("```sh block without a <!-- check: run --> or <!-- check: skip: REASON --> marker")
    n++
    if (marker == "<!-- check: run -->") { file = sprintf("%s/%02d.run", dir, n) }
    else if (match(marker, /^<!-- check: skip: .+ -->$/)) {
      file = sprintf("%s/%02d.skip", dir, n)
      reason = marker; sub(/^<!-- check: skip: /, "", reason); sub(/ -->$/, "", reason)
      print reason > file
      file = "/dev/null"
    } else fail("unknown marker " marker)
    marker = ""; inblock = 1; next
  }
  inblock && /^```$/ { inblock = 0; next }
  inblock { print > file; next }
  marker != "" && NF { fail("marker not followed by a ```sh block") }
  END { if (!bad && n == 0) { print "docs/first-gpu-host.md: no blocks" > "/dev/stderr"; exit 1 } }
' "$guide"

# A copy of the repository (tracked and unignored files) to run the blocks in;
# a tracked file deleted in the working tree is not copied.
(cd "$repo" && git ls-files -z --cached --others --exclude-standard |
  xargs -0 cp --parents -t "$tmp/src" 2>/dev/null) || true
[ -f "$tmp/src/Makefile" ] || { echo "could not copy the repository" >&2; exit 1; }

# A host's skeleton.
mkdir -p "$root"/{etc/systemd/system,usr/lib/sysusers.d,usr/lib/tmpfiles.d,usr/local/bin,usr/share/doc,var/lib,srv,opt/vllm/bin}

# The simulator as vLLM, with the poold that the guide installs.
cat >"$root/opt/vllm/bin/vllm" <<EOF
#!/bin/sh
[ "\$1" = serve ] && shift
exec "$root/usr/local/bin/poold" engine-sim "\$@"
EOF
chmod +x "$root/opt/vllm/bin/vllm"

# inroot: moves the absolute host paths of stdin under the root.
cat >"$tmp/bin/inroot" <<EOF
#!/bin/sh
exec sed -E 's#(^|[[:space:]=:"'"'"'(])/(etc|usr|srv|var|opt)/#\1$root/\2/#g'
EOF
chmod +x "$tmp/bin/inroot"

# poold's port: a free one below the ephemeral range (the guide says 8080).
for _ in $(seq 1 100); do
  port=$((20000 + RANDOM % 12000))
  (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null || break
done

cat >"$tmp/bin/systemctl" <<EOF
#!/usr/bin/env bash
# Stand-in for systemctl: daemon-reload, enable --now, start, stop, status.
set -euo pipefail
root=$root state=$state tmp=$tmp port=$port
EOF
cat >>"$tmp/bin/systemctl" <<'EOF'
units=$root/etc/systemd/system
# unit_lines NAME KEY: the values of KEY in the unit and its drop-ins, in order.
unit_lines() {
  cat "$units/$1" "$units/$1.d"/*.conf 2>/dev/null | sed -n "s/^$2=//p"
}
verify() {
  local v=$tmp/verify
  rm -rf "$v"; mkdir -p "$v"
  for unit in "$units"/*.service; do
    name=$(basename "$unit")
    sed "s|/usr/local/bin/|$root/usr/local/bin/|g" "$unit" >"$v/$name"
    if [ -d "$unit.d" ]; then
      mkdir -p "$v/$name.d"
      for d in "$unit.d"/*.conf; do sed "s|/usr/local/bin/|$root/usr/local/bin/|g" "$d" >"$v/$name.d/$(basename "$d")"; done
    fi
    out=$(systemd-analyze verify "$v/$name" 2>&1) || { echo "$out" >&2; exit 1; }
    [ -z "$out" ] || { echo "systemd-analyze verify $name: $out" >&2; exit 1; }
    systemd-analyze security --offline=true --root="$root" --no-pager "$name" | tail -n 1
  done
}
start() {
  local unit=$1.service
  [ -f "$units/$unit" ] || { echo "systemctl: unit $unit not found" >&2; exit 5; }
  if [ -f "$state/pid" ] && kill -0 "$(cat "$state/pid")" 2>/dev/null; then return; fi
  # The unit's environment, paths moved under the root, then the stand-ins'
  # port; PATH keeps the host's after the unit's own.
  local -a env=()
  while read -r line; do
    for kv in $line; do env+=("$kv"); done
  done < <(unit_lines "$unit" Environment | "$tmp/bin/inroot")
  local path=/usr/bin:/bin
  for kv in "${env[@]}"; do case $kv in PATH=*) path=${kv#PATH=};; esac; done
  env+=("PATH=$path:$PATH" "POOLD_LISTEN=127.0.0.1:$port")
  mkdir -p "$root/var/lib/$(unit_lines "$unit" StateDirectory | tail -n 1)"
  while read -r cmd; do
    env -i "${env[@]}" bash -c "$cmd" >>"$state/log" 2>&1 || { echo "ExecStartPre failed: $cmd" >&2; cat "$state/log" >&2; exit 1; }
  done < <(unit_lines "$unit" ExecStartPre | "$tmp/bin/inroot")
  local cmd
  cmd=$(unit_lines "$unit" ExecStart | tail -n 1 | "$tmp/bin/inroot")
  env -i "${env[@]}" bash -c "exec $cmd" >>"$state/log" 2>&1 &
  echo $! >"$state/pid"
  # Type=notify: ready once poold listens.
  for _ in $(seq 1 600); do
    curl -s -o /dev/null "http://127.0.0.1:$port/health" && return
    kill -0 "$(cat "$state/pid")" 2>/dev/null || { echo "poold exited:" >&2; cat "$state/log" >&2; exit 1; }
    sleep 0.1
  done
  echo "poold did not listen within 60s" >&2; exit 1
}
stop() {
  [ -f "$state/pid" ] || return 0
  local pid; pid=$(cat "$state/pid")
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 1200); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  rm -f "$state/pid"
}
args=()
for a in "$@"; do case $a in --now|--no-pager|-l) ;; *) args+=("$a");; esac; done
case "${args[0]:-}" in
  daemon-reload) verify ;;
  enable)
    # enable alone changes nothing here; enable --now also starts.
    if [[ " $* " == *" --now "* ]]; then start "${args[1]%.service}"; fi ;;
  start) start "${args[1]%.service}" ;;
  stop) stop ;;
  restart) stop; start "${args[1]%.service}" ;;
  status)
    if [ -f "$state/pid" ] && kill -0 "$(cat "$state/pid")" 2>/dev/null; then
      echo "${args[1]%.service}.service - active (running) under the guide check's stand-in, pid $(cat "$state/pid")"
    else
      echo "${args[1]%.service}.service - inactive"; exit 3
    fi ;;
  *) echo "systemctl stand-in: unsupported: $*" >&2; exit 1 ;;
esac
EOF

cat >"$tmp/bin/journalctl" <<EOF
#!/bin/sh
# Stand-in for journalctl -u poold: poold's log (the options are ignored).
cat "$state/log"
EOF
cat >"$tmp/bin/runuser" <<'EOF'
#!/bin/sh
# Stand-in for runuser -u USER -- CMD: runs CMD as the current user.
[ "$1" = -u ] && shift 2
[ "$1" = -- ] && shift
exec "$@"
EOF
for tool in systemd-sysusers systemd-tmpfiles; do
  real=$(command -v "$tool")
  printf '#!/bin/sh\nexec %s --root=%s "$@"\n' "$real" "$root" >"$tmp/bin/$tool"
done
chmod +x "$tmp/bin"/*

ran=0 skipped=0
for block in "$tmp/blocks"/*; do
  case $block in
    *.skip)
      echo "skipped block $(basename "${block%.skip}"): $(cat "$block")"
      skipped=$((skipped + 1))
      continue ;;
  esac
  n=$(basename "${block%.run}")
  script=$("$tmp/bin/inroot" <"$block" | sed "s#127\.0\.0\.1:8080#127.0.0.1:$port#g")
  echo "--- block $n"
  if ! (cd "$tmp/src" && PATH="$tmp/bin:$root/usr/local/bin:$PATH" POOLD_LISTEN=127.0.0.1:$port \
        timeout 300 bash -euo pipefail -c "$script") >"$tmp/out" 2>&1; then
    echo "FAIL: block $n of docs/first-gpu-host.md:" >&2
    cat "$block" >&2
    echo "--- its output:" >&2
    tail -n 40 "$tmp/out" >&2
    if [ -f "$state/log" ]; then
      echo "--- poold's log:" >&2
      tail -n 40 "$state/log" >&2
    fi
    exit 1
  fi
  tail -n 5 "$tmp/out"
  ran=$((ran + 1))
done

# Every Documentation= file of the installed units was installed.
for unit in "$root"/etc/systemd/system/*.service; do
  # shellcheck disable=SC2013 # a Documentation= line may hold several names
  for doc in $(sed -n 's#^Documentation=file://##p' "$unit"); do
    [ -f "$root$doc" ] || { echo "FAIL: $(basename "$unit") names $doc, which the guide does not install" >&2; exit 1; }
  done
done
echo "docs/first-gpu-host.md: $ran blocks ran, $skipped skipped"
