#!/usr/bin/env bash
# A raw-socket AgentOS client in Bash: HELLO, NOOP, THINK and LIST over the
# 17-byte-header protocol. Bash cannot open a Unix socket itself, so socat
# (or, failing that, an nc with -U) carries the bytes as a coprocess.
#
#     bash examples/clients/client.sh [SOCKET]
set -euo pipefail
# Byte semantics throughout: ${#payload} must count bytes, not characters,
# because the header carries the payload's length in bytes.
export LC_ALL=C

MAGIC=0x41474E54
path=${1:-${AGENTOS_SOCKET:-/run/agentos/agentos.sock}}

die() {
  echo "$*" >&2
  exit 1
}

if command -v socat >/dev/null 2>&1; then
  coproc KERNEL { exec socat - "UNIX-CONNECT:$path"; }
# The traditional netcat has no -U; only the OpenBSD nc and ncat can be used.
elif command -v nc >/dev/null 2>&1 && [[ $(nc -h 2>&1) == *[[:space:]]-U[[:space:]]* ]]; then
  coproc KERNEL { exec nc -U "$path"; }
else
  die "cannot talk to the kernel at $path: Bash needs socat (or an nc with -U) to reach a Unix socket"
fi
# Bash closes a coprocess's fds and unsets KERNEL as soon as it reaps the
# helper, so keep our own copies while they still exist.
helper_pid=$KERNEL_PID
exec {to_kernel}>&"${KERNEL[1]}" {from_kernel}<&"${KERNEL[0]}"
# Whatever way we leave, take the helper with us: some nc builds never hang
# up on their own when their input ends.
trap 'kill "$helper_pid" 2>/dev/null || true' EXIT

# Little-endian bytes as \xNN escapes for printf %b: a header holds NUL
# bytes, which no Bash variable can, so they stay escapes until written.
le() {
  local width=$1 value=$2 i
  for ((i = 0; i < width; i++)); do
    printf '\\x%02x' $(((value >> 8 * i) & 0xFF))
  done
}

# Exactly N bytes from the kernel. dd with a one-byte block never reads past
# what it was asked for, so the next reply stays in the pipe (some heads
# read ahead). Slow for megabytes, fine for these replies.
read_bytes() {
  dd bs=1 count="$1" <&"$from_kernel" 2>/dev/null
}

# Sends one request and prints "NAME REPLY", as the other clients do.
call() {
  local name=$1 opcode=$2 payload=$3
  # A helper that failed to connect has closed the pipe: ignore SIGPIPE for
  # this write alone, so the failure gets a message instead of ending the
  # script without a word.
  (
    trap '' PIPE
    printf '%b%s' "$(le 4 "$MAGIC")$(le 4 0)$(le 1 "$opcode")$(le 8 "${#payload}")" "$payload"
  ) 1>&"$to_kernel" 2>/dev/null || die "cannot talk to the kernel at $path"

  # The header as 17 decimal numbers: od copes with NUL bytes, Bash would not.
  local header=() length=0 i
  read -r -d '' -a header < <(read_bytes 17 | od -An -v -tu1) || true
  ((${#header[@]} == 17)) || die "no reply from the kernel at $path: it could not be reached, or it hung up"
  ((MAGIC == (header[0] | header[1] << 8 | header[2] << 16 | header[3] << 24))) ||
    die "bad magic in a reply"
  for ((i = 16; i >= 9; i--)); do
    length=$((length << 8 | header[i]))
  done

  # The trailing x keeps any final newline, which $(...) would strip.
  local reply
  reply=$(read_bytes "$length"; printf x)
  reply=${reply%x}
  ((${#reply} == length)) ||
    die "a reply from the kernel was cut short (or held a NUL byte, which Bash cannot keep)"
  printf '%s %s\n' "$name" "$reply"
}

call hello 0xFE ''
call noop 0x00 ping
call think 0x01 'What is 2+2?'
call list 0x12 ''
