"""Reads the per-instruction page of an Nsight Compute report, exported as
CSV (`ncu -i REPORT --page source --csv --print-source sass > K.csv`;
bench/profile_attention.sh writes them with KILN_PROFILE_SOURCE=1).

    python3 bench/ncu_source.py K.csv mix            executed instructions by opcode
    python3 bench/ncu_source.py K.csv top [N]        the N instructions with the most stall samples
    python3 bench/ncu_source.py K.csv loop [COUNT]   the instructions executed COUNT times (default: the
                                                     most common count, a kernel's main loop), in order,
                                                     without the softmax's arithmetic, with their top stalls

A kernel's loop is visible by its execution count: every instruction of a
loop body runs (tiles x warps x iterations) times.
"""
import collections
import csv
import signal
import sys

ARITHMETIC = ("FMUL", "FADD", "FFMA", "FMNMX", "MUFU", "F2FP")


def read(path):
    rows = list(csv.reader(open(path)))
    header = rows[1]  # rows[0] names the kernel
    col = {h: i for i, h in enumerate(header)}
    stalls = [h for h in header if h.startswith("stall_") and "(Not Issued)" not in h]
    out = []
    for r in rows[2:]:
        if len(r) < len(header):
            continue
        out.append({"source": r[col["Source"]].strip(), "samples": int(r[col["Warp Stall Sampling (All Samples)"]] or 0),
                    "executed": int(r[col["Instructions Executed"]] or 0),
                    "stalls": {h[len("stall_"):]: int(r[col[h]] or 0) for h in stalls}})
    return rows[0][1] if len(rows[0]) > 1 else "", out


def opcode(source):
    words = [w for w in source.split() if not w.startswith("@")]
    return words[0] if words else "?"


def top_stalls(stalls, n=2):
    return " ".join(f"{k}:{v}" for v, k in sorted(((v, k) for k, v in stalls.items() if v), reverse=True)[:n])


def main():
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # quiet under `| head`
    if len(sys.argv) < 3 or sys.argv[2] not in ("mix", "top", "loop"):
        sys.exit(__doc__)
    kernel, data = read(sys.argv[1])
    samples, executed = sum(d["samples"] for d in data), sum(d["executed"] for d in data)
    print(f"{kernel[:100]}\n{len(data)} instructions, {executed} executed, {samples} stall samples")
    mode = sys.argv[2]
    if mode == "mix":
        by_op = collections.Counter()
        for d in data:
            by_op[opcode(d["source"])] += d["executed"]
        for op, n in by_op.most_common(40):
            print(f"{n:12d} {100 * n / executed:5.1f}%  {op}")
    elif mode == "top":
        count = int(sys.argv[3]) if len(sys.argv) > 3 else 40
        for d in sorted(data, key=lambda d: -d["samples"])[:count]:
            print(f"{d['samples']:7d} {100 * d['samples'] / samples:5.1f}%  x{d['executed']:<10d} {d['source'][:90]:90s} "
                  f"{top_stalls(d['stalls'])}")
    else:
        counts = collections.Counter(d["executed"] for d in data if d["executed"])
        target = int(sys.argv[3]) if len(sys.argv) > 3 else counts.most_common(1)[0][0]
        body = [(i, d) for i, d in enumerate(data) if d["executed"] == target]
        print(f"loop body: {len(body)} instructions executed {target} times, "
              f"{sum(d['samples'] for _, d in body)} samples ({len(body) - sum(opcode(d['source']).startswith(ARITHMETIC) for _, d in body)} "
              f"shown: the softmax's arithmetic left out)")
        for i, d in body:
            if not opcode(d["source"]).startswith(ARITHMETIC):
                print(f"{i:5d} {d['samples']:6d}  {d['source'][:90]:90s} {top_stalls(d['stalls'])}")


if __name__ == "__main__":
    main()
