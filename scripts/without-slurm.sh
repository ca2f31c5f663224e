#!/usr/bin/env bash
# Run a command with no SLURM command on its PATH, whatever this machine has installed (an earlier
# `make test-slurm` leaves Debian's slurm packages in /usr/bin): .ci/run runs `make test` through it, to show that
# the suite outside the slurm-marked tests needs nothing `make install` does not install (issue 81).
# A PATH folder that holds a SLURM command is replaced by a folder of links to its other programs; the rest stay.
#   scripts/without-slurm.sh COMMAND [ARGS...]
set -euo pipefail
SLURM_COMMANDS=(sacct sacctmgr salloc sattach sbatch sbcast scancel scontrol scrontab sdiag sh5util sinfo sprio
  squeue sreport srun sshare sstat strigger sview slurmctld slurmd slurmdbd slurmstepd)
shadows=$(mktemp -d "${TMPDIR:-/tmp}/without-slurm.XXXXXX")
trap 'rm -rf "$shadows"' EXIT
is_slurm() {
  local command
  for command in "${SLURM_COMMANDS[@]}"; do [ "$1" = "$command" ] && return 0; done
  return 1
}
holds_slurm() {
  local command
  for command in "${SLURM_COMMANDS[@]}"; do [ -e "$1/$command" ] && return 0; done
  return 1
}
kept=() hidden=()
IFS=: read -ra folders <<<"$PATH"
for i in "${!folders[@]}"; do
  folder=${folders[$i]}
  if [ -z "$folder" ] || [ ! -d "$folder" ] || ! holds_slurm "$folder"; then
    kept+=("$folder")
    continue
  fi
  shadow="$shadows/$i"
  mkdir "$shadow"
  for program in "$folder"/*; do
    name=${program##*/}
    if is_slurm "$name"; then hidden+=("$program"); else ln -s "$program" "$shadow/$name"; fi
  done
  kept+=("$shadow")
done
PATH=$(IFS=:; echo "${kept[*]}")
export PATH
if found=$(command -v scontrol); then
  echo "without-slurm: scontrol is still on PATH ($found)" >&2
  exit 1
fi
echo "without-slurm: \`command -v scontrol\` finds nothing; hidden: ${hidden[*]:-none (no SLURM command was on PATH)}"
# not exec: the trap removes the links once the command is done
"$@"
