"""The weight data plane: trainer -> master relay -> relay chain -> local rollouts.

slots.py      shared-memory weight slots with reader counts (what a version lives in on a node)
wire.py       the chunk protocol between relays over TCP
admission.py  a relay's pending handshakes: one deadline each, limits per address and in all
forward.py    a relay's downstream link: forwards chunk i while chunk i+1 arrives
relay.py      Relay (receive, verify, expose complete versions, serve local readers) and RelayActor
publisher.py  WeightPublisher: the trainer's publish, a copy into local shared memory and one async call
pull.py       pull_latest / SlotReader: a rollout maps its node relay's slot and loads it in place
pinning.py    registering slots with CUDA so GPU copies run at PCIe speed
chain.py      placing one relay per node, building and rebuilding the chain
bench.py      `laminar bench relay`

Nothing is imported here, so `laminar bench relay` can configure Ray before Ray is imported.
"""
