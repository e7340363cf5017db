"""serve_smoke records -> measurements.json summary and the README smoke table."""


def summarize(variant, recs):
    latest = recs[-1][1]
    return {"latest": {"ready_s": latest["payload"]["ready_s"], "device": latest["provenance"]["device"]["name"],
                       "weights": latest["provenance"]["weights"], "utc": latest["provenance"]["utc"],
                       "completion_ms": latest["payload"]["endpoints"]["POST /v1/completions"]["latency_ms"]}}


def readme_table(docs):
    rows = ["| variant | device | weights | start to ready (s) | completion (ms) | record |", "|---|---|---|---|---|---|"]
    for name, doc in docs.items():
        s = doc["results"].get("serve_smoke")
        if s:
            l = s["latest"]
            rows.append(f"| `{name}` | {l['device']} | {l['weights']} | {l['ready_s']:.1f} | "
                        f"{l['completion_ms']:.0f} | `{s['records'][-1]}` |")
    return "\n".join(rows)
