"""min_cut: the smallest sink side among the minimum cuts of a flow network, for networks made of many small
independent pieces (the cut-cost rule's: a few ops of shape arithmetic per feature, thousands of features).

    net = FlowNetwork()
    net.add_edge(SOURCE, ("n", "shape"), 200)          # capacities are integers; None is infinite
    net.add_edge(("n", "shape"), ("t", "shape:0"), 1000)
    net.add_edge(("t", "shape:0"), SINK)
    net.sink_side()                                     # {"T", ("n", "shape"), ("t", "shape:0")}

The answer is networkx's (preflow_push, then what reaches the sink in the residual graph); the work is linear in
the network for pieces of bounded size, where networkx's is that of one large problem.
"""

from __future__ import annotations


SOURCE, SINK = "S", "T"  # the network's source and sink, as FlowNetwork keys


class FlowNetwork:
    """A flow network with integer capacities (None: infinite), and the sink side of its minimum cut that has
    the fewest nodes: the nodes that reach T in the residual graph of a maximum flow. That set is the same for
    every maximum flow (it is the intersection of the sink sides of all minimum cuts), so the algorithm that
    finds the flow does not change it.

    The network is solved per weakly connected component of its nodes other than S and T: no path of the
    residual graph of a maximum flow leads from a component to T through S (S would then reach T), so each
    component's cut is its own, and the work is that of many small problems (a few ops of shape arithmetic
    per feature), not of one large one. Each is solved with Dinic's algorithm (iterative: a component may be a
    chain of thousands of nodes)."""

    def __init__(self):
        self._index: dict = {SOURCE: 0, SINK: 1}
        self._keys: list = [SOURCE, SINK]
        self._adj: list[list[int]] = [[], []]  # node -> its edges; edge e runs to head[e], its reverse is e ^ 1
        self._head: list[int] = []
        self._cap: list[int | None] = []  # residual capacity (None: infinite, until sink_side())
        self._edge: dict[tuple[int, int], int] = {}  # one edge per ordered pair, as a networkx DiGraph

    def _node(self, key) -> int:
        i = self._index.get(key)
        if i is None:
            i = self._index[key] = len(self._keys)
            self._keys.append(key)
            self._adj.append([])
        return i

    def add_edge(self, u, v, capacity: int | None = None) -> None:
        """As networkx's DiGraph.add_edge(u, v, capacity=...): adding an edge again without a capacity keeps it."""
        u, v = self._node(u), self._node(v)
        if u == v:
            return  # a self-loop carries no flow (networkx's residual network drops it too)
        e = self._edge.get((u, v))
        if e is None:
            e = self._edge[(u, v)] = len(self._head)
            self._adj[u].append(e)
            self._head.append(v)
            self._cap.append(capacity)
            self._adj[v].append(e + 1)
            self._head.append(u)
            self._cap.append(0)
        elif capacity is not None:
            self._cap[e] = capacity

    def sink_side(self) -> set:
        """The keys of the nodes that reach T in the residual graph of a maximum flow (T included)."""
        head, cap, adj = self._head, self._cap, self._adj
        infinite = sum(c for c in cap if c is not None) + 1  # more than any cut of finite edges: never saturated
        for e, c in enumerate(cap):
            if c is None:
                cap[e] = infinite
        parent = list(range(len(adj)))

        def root(i: int) -> int:
            while parent[i] != i:
                parent[i] = parent[parent[i]]
                i = parent[i]
            return i

        for e in range(0, len(head), 2):
            u, v = head[e + 1], head[e]
            if u > 1 and v > 1:
                ru, rv = root(u), root(v)
                if ru != rv:
                    parent[ru] = rv
        from_s: dict[int, list[int]] = {}  # component -> the edges S has into it (and the reverses of edges to S)
        for e in adj[0]:
            from_s.setdefault(root(head[e]), []).append(e)
        into_t: dict[int, list[int]] = {}  # component -> the reverses of its edges into T (and T's edges)
        for e in adj[1]:
            into_t.setdefault(root(head[e]), []).append(e)
        side = {SINK}
        keys = self._keys
        for component, t_edges in into_t.items():  # nothing reaches T from a component without an edge into it
            s_edges = from_s.get(component, [])
            _max_flow(head, cap, adj, s_edges)
            reached = {1}
            queue = [1]
            for v in queue:  # backwards from T along edges with residual capacity (S never: the flow is maximum)
                for e in (t_edges if v == 1 else adj[v]):  # e: v -> w; its reverse e ^ 1: w -> v
                    w = head[e]
                    if w not in reached and w != 0 and cap[e ^ 1] > 0:
                        reached.add(w)
                        queue.append(w)
            side.update(keys[i] for i in reached)
        return side


def _max_flow(head: list[int], cap: list[int], adj: list[list[int]], s_edges: list[int]) -> None:
    """Dinic's algorithm on one component of the network (S = 0, T = 1; S's edges into it are `s_edges`):
    a level graph by BFS from S, then augmenting paths in it until it is blocked, until T is out of reach.
    Leaves the residual capacities in `cap`."""
    while True:
        level = {0: 0}
        queue = [0]
        for u in queue:
            if u == 1:
                continue
            for e in (s_edges if u == 0 else adj[u]):
                v = head[e]
                if cap[e] > 0 and v not in level:
                    level[v] = level[u] + 1
                    queue.append(v)
        if 1 not in level:
            return
        next_edge: dict[int, int] = {}
        while True:
            path: list[int] = []
            u = 0
            while u != 1:
                edges = s_edges if u == 0 else adj[u]
                i = next_edge.get(u, 0)
                below = level[u] + 1
                while i < len(edges):
                    e = edges[i]
                    if cap[e] > 0 and level.get(head[e]) == below:
                        break
                    i += 1
                next_edge[u] = i
                if i < len(edges):
                    path.append(edges[i])
                    u = head[edges[i]]
                    continue
                if u == 0:
                    break
                level[u] = -1  # a dead end in this phase
                u = head[path.pop() ^ 1]
                next_edge[u] += 1
            if u != 1:
                break
            pushed = min(cap[e] for e in path)
            for e in path:
                cap[e] -= pushed
                cap[e ^ 1] += pushed


__all__ = ["FlowNetwork", "SINK", "SOURCE"]
