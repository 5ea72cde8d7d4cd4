# bench/ratio-summary.sh - sourced by the bench/ scripts that run pairs:
#   ratio_summary LABEL RATIOS
# prints "LABEL: median M  mean A  (N pairs)" over the space-separated
# RATIOS, three decimals.
ratio_summary() {
  echo "$2" | tr ' ' '\n' | sed '/^$/d' | sort -n |
    awk -v label="$1" '{ v[NR] = $1; t += $1 }
      END { m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2;
            printf "%s: median %.3f  mean %.3f  (%d pairs)\n", label, m, t / NR, NR }'
}
