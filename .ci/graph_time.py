"""CUDA-graph timing the `.ci/` probes share (inductor_tune_probe.py, fa_split_probe.py, draft_cutlass_probe.py): `calls`
calls of fn(*args) captured in one graph after three warm-up calls on a side stream, the graph replayed `replays`
times, microseconds a call from CUDA events. A replay times the kernels and the gaps between them inside the graph, not the host's launch of each, as a served
step's graph does.
"""
import torch


def time_graph(fn, args, calls=200, replays=20):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn(*args)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn(*args)
    graph.replay()
    torch.cuda.synchronize()
    per = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        per.append(a.elapsed_time(b) * 1000.0 / calls)
    per.sort()
    return {"us_median": round(per[len(per) // 2], 3), "us_min": round(per[0], 3), "us_max": round(per[-1], 3)}
