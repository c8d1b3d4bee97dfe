"""Does `recommend(..., compression=True)` pick what the compression experiment measured?

    python -m experiments.compression_recommend    # after experiments.compression_training

For every emulated cell of `results/compression_training.json` (link rate,
P, model), the cost model is asked with what a user would know: the link's
goodput and latency (measured on the shaped link: goodput, half the round
trip), the model's gradient shapes, P, and the step's computation
(`compute_seconds`: the median step of the uncompressed run on loopback,
where the wire costs little). Compared per compressor: the predicted step
speedup over fp16, (compute + fp16's predicted communication) / (compute +
the compressor's), against the measured one (fp16's median step / the
compressor's); and per cell the pick among `default_compressors()` - a
lossy compressor only where the whole step is predicted 2x faster
(`LOSSY_STEP_SPEEDUP`) - against the measurement: did a lossy compressor
reach the target accuracy that many times sooner than fp16 and fp32?
Writes results/compression_recommend.json.
"""

import json
import os

from benchmarks.harness import write_result

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")

SOURCE = "compression_training.json"


def _compressors():
    from tfdist import compression  # pylint: disable=import-outside-toplevel

    return {"fp16": compression.FP16(), "powersgd_r1": compression.PowerSGD(rank=1),
            "powersgd_r2": compression.PowerSGD(rank=2),
            "powersgd_r4": compression.PowerSGD(rank=4),
            "topk_1%": compression.TopK(0.01), "topk_0.1%": compression.TopK(0.001),
            "signsgd": compression.SignSGD()}


def _model(name):
    from experiments.compression_worker import MODELS  # pylint: disable=import-outside-toplevel

    _, build_model = MODELS[name][0]()
    return build_model()


def _cells(result):
    grouped = {}
    for cell in result["cells"]:
        grouped.setdefault((str(cell["network"]), cell["processes"], cell["model"]),
                           {})[cell["compressor"]] = cell
    return grouped


def analyse(result):
    from tfdist.aggregation.recommend import (  # pylint: disable=C0415
        LOSSY_STEP_SPEEDUP, recommend)

    compressors = _compressors()
    grouped = _cells(result)
    rows = []
    for (network, processes, model_name), cells in sorted(grouped.items()):
        link = result.get("links", {}).get(network)
        loopback = grouped.get(("loopback", processes, model_name), {})
        if link is None or "fp32" not in loopback or "fp16" not in cells:
            continue
        model = _model(model_name)
        bandwidth, latency = link["goodput_MBps"] * 8e6, link["rtt_s"] / 2
        compute = loopback["fp32"]["median_step_ms"] / 1e3
        # Every compressor timed by the cost model as `recommend` times it (sparse gradients
        # exact); the pick among the compressors `recommend` considers by default.
        timed = recommend(model, processes, bandwidth, latency, candidates=[("ring", {})],
                          compression=list(compressors.values()), compute_seconds=compute)
        predicted = {repr(c.compression): compute + c.predicted_seconds
                     for c in timed.alternatives}
        fp16_step = predicted[repr(compressors["fp16"])]
        per_compressor = {
            name: {"predicted_step_speedup_over_fp16": round(fp16_step / predicted[repr(c)], 3),
                   "measured_step_speedup_over_fp16": round(
                       cells["fp16"]["median_step_ms"] / cells[name]["median_step_ms"], 3),
                   "time_to_target_s": cells[name]["time_to_target_s"],
                   "final_vs_fp32_points": cells[name]["final_vs_fp32_points"]}
            for name, c in compressors.items() if name in cells}
        pick = recommend(model, processes, bandwidth, latency, candidates=[("ring", {})],
                         compression=True, compute_seconds=compute)
        lossless_best = min((cells[n]["time_to_target_s"] for n in ("fp32", "fp16")
                             if n in cells and cells[n]["time_to_target_s"] is not None),
                            default=None)
        lossy_sooner = sorted(
            (cell["time_to_target_s"], name) for name, cell in cells.items()
            if name not in ("fp32", "fp16") and cell["time_to_target_s"] is not None
            and (lossless_best is None or cell["time_to_target_s"] < lossless_best))
        # "Pays clearly": the target reached LOSSY_STEP_SPEEDUP times sooner than lossless.
        pays = [name for seconds, name in lossy_sooner
                if lossless_best is None or seconds * LOSSY_STEP_SPEEDUP <= lossless_best]
        picked_lossy = pick.compression is not None and pick.compression.changes_training
        rows.append({
            "network": network, "processes": processes, "model": model_name,
            "bandwidth_bits_per_s": bandwidth, "latency_s": latency, "compute_seconds": compute,
            "recommend": repr(pick.compression), "predicted_step_speedup": round(
                pick.step_speedup, 3),
            "measured_lossy_sooner_than_lossless": {
                name: round(lossless_best / seconds, 3) if lossless_best else None
                for seconds, name in lossy_sooner},
            "measured_lossy_paying_clearly": pays,
            "agrees": picked_lossy == bool(pays),
            "per_compressor": per_compressor})
    agree = sum(r["agrees"] for r in rows)
    return {"summary": {"cells": len(rows), "recommend_agrees_with_measurement": agree},
            "rows": rows, "description": __doc__.split("\n\n", 2)[2]}


def main():
    with open(os.path.join(RESULTS, SOURCE), encoding="utf-8") as f:
        result = analyse(json.load(f))
    write_result("compression_recommend.json", result, results=RESULTS)
    print(json.dumps(result["summary"]))
    for row in result["rows"]:
        print(row["network"], row["model"], "pick", row["recommend"], "lossy sooner:",
              row["measured_lossy_sooner_than_lossless"], "agrees", row["agrees"])


if __name__ == "__main__":
    main()
