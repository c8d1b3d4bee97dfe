"""How a flat buffer is cut into pieces and spread over the shard servers."""

from tfdist.aggregation.fusion import near_equal_sizes

DEFAULT_PIECE_BYTES = 1024 * 1024
MIN_SPLIT_BYTES = 64 * 1024


class ShardPlan:
    """How one flat buffer of `num_elements` is cut into pieces and spread over servers.

    The buffer is cut into a multiple of K near-equal pieces of at most
    `piece_bytes` each (so large variables are split, and every message stays
    under gRPC's limit), and piece i goes to server (first_server + i) mod K:
    every server carries the same number of pieces, whose sizes differ by at
    most one element, so no server moves more than 1/K of the bytes plus one
    element per piece. Buffers under K * `MIN_SPLIT_BYTES` are latency-bound:
    they are cut into fewer pieces of at least `MIN_SPLIT_BYTES` (one for
    metric state), and successive call sites start at successive servers.
    """

    def __init__(self, num_elements, element_bytes, num_servers, piece_bytes, first_server=0):
        self.num_servers = int(num_servers)
        self.element_bytes = element_bytes
        total = num_elements * element_bytes
        if total < num_servers * MIN_SPLIT_BYTES:
            # Small buffers are latency-bound: pieces of at least MIN_SPLIT_BYTES only.
            count = total // MIN_SPLIT_BYTES
        else:
            count = num_servers * -(-total // (num_servers * piece_bytes))
        self.sizes = near_equal_sizes(num_elements, count)
        self.servers = [(first_server + i) % self.num_servers for i in range(len(self.sizes))]

    def bytes_per_server(self):
        totals = [0] * self.num_servers
        for size, server in zip(self.sizes, self.servers):
            totals[server] += size * self.element_bytes
        return totals

    def describe(self):
        totals = ", ".join(f"server {k}: {b / 1e6:.3f} MB" for k, b in
                           enumerate(self.bytes_per_server()))
        return f"{len(self.sizes)} pieces of at most {max(self.sizes) * self.element_bytes} B ({totals})"
