#!/usr/bin/env bash
# rounds of variants in turns: each line of the file "$1" is "label|env...|python|threads"
variants=$(realpath "$1")
cd "$(dirname "$0")/../.."
for r in 1 2 3; do
  while IFS='|' read -r label envs py th; do
    [ -z "$label" ] && continue
    out=$(env $envs $py scripts/probes/steptime_tf221.py $th 2>/dev/null | tail -1)
    echo "round $r | $label | $out"
  done < "$variants"
done
