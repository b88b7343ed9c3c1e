"""Draft tokens for a request from the text its group has produced (grouped speculative decoding, no draft model).

The samples of a group answer the same prompt and share much of their text. A request's draft continues its own
latest tokens the way its group's text continued them before: every stream of the group (each request's prompt
plus output, running or finished, this request's own included) is indexed by its n-grams, n-gram -> where it
ends; the longest n-gram ending the request (MAX_NGRAM tokens down to MIN_NGRAM) picks the places that match, and
the draft follows them a token at a time, taking the token most of them continue with (the latest on a tie) and
keeping only the places that agree. The index grows as tokens arrive: each stream's new tokens are added when the
group next drafts, a few dictionary updates a token, on the host. A request that moves to another engine (repack)
takes its group's text along (`ExportedRequest.group_text`), so a tail request drafts from its finished siblings
wherever it runs on.

Which tokens are drafted never changes what a request samples (`sampler.accepted_prefix`): drafts only decide how
many of its tokens one step computes. How much to draft is adaptive: each request's draft length follows its
recent acceptance, and each group keeps a running rate of accepted draft tokens that `rollout.speculation=auto`
compares with `Speculation.min_acceptance`.
"""

from __future__ import annotations

from collections import Counter

MIN_NGRAM, MAX_NGRAM = 2, 4  # the n-grams indexed: shorter matches draft noise, longer ones rarely match more
MAX_TEXTS = 16  # sibling texts a moved request carries (the latest): a group, bounded if it moves often
MAX_MATCHES = 16  # places a draft follows (the latest): enough to vote, few enough to stay cheap
ACCEPTANCE_WEIGHT = 0.1  # a group's running acceptance: each draft outcome moves it this far
# The index holds no container per n-gram: a place (stream, position) is one integer, stream * PLACE + position,
# kept in one flat list, and the n-gram's earlier places are a chain through a second one. A list of tuples per
# n-gram (hundreds of thousands of them once tail requests bring their siblings' text) was walked by every full
# garbage collection: 0.15 s each, inside the decode loop.
PLACE = 1 << 32


class GroupText:
    """One group's streams (a request's `token_ids` list each, shared with its `Sequence`, so live ones keep
    growing), the n-gram index over them, and the group's running acceptance. Streams are append-only, so an
    entry (stream, end) stays true; a stream's continuation is read from the list as it is now."""

    def __init__(self, prompt_len: int) -> None:
        self.prompt_len = prompt_len
        self.streams: list[list[int]] = []
        self.indexed: list[int] = []  # positions of each stream already in the index
        self.slot: dict[str, int] = {}  # request id -> its stream
        self.live: set[int] = set()  # streams of requests still here: the only ones that grow
        self.index: dict[tuple[int, ...], int] = {}  # n-gram -> the latest entry where it ends
        self.places: list[int] = []  # entry -> its place (`PLACE`)
        self.earlier: list[int] = []  # entry -> the entry where the same n-gram ended before it (-1: none)
        self.members = 0  # requests of the group in the engine; the group goes when none is left
        self.acceptance = 1.0  # running rate of accepted draft tokens: optimistic until drafts say otherwise

    def join(self, request_id: str, tokens: list[int]) -> int:
        """Add a request's stream, or point its slot at its new list when it comes back with the text it left
        with (moved out and in again: the entries made of its old list still hold). The group's prompt is
        indexed once, with the first stream."""
        self.members += 1
        s = self.slot.get(request_id)
        if s is not None and tokens[: self.indexed[s]] == self.streams[s][: self.indexed[s]]:
            self.streams[s] = tokens
        else:
            self.slot[request_id] = s = len(self.streams)
            self.streams.append(tokens)
            # n-grams ending inside the prompt are the same in every stream: only the first indexes them
            self.indexed.append(0 if s == 0 else self.prompt_len - 1)
        self.live.add(s)
        return s

    def add_text(self, tokens: list[int]) -> None:
        """A sibling's text from another engine (prompt plus output), indexed once and never growing; one that
        is already here (it came with an earlier move) is not added again."""
        if tokens in self.streams:
            return
        self.indexed.append(0 if not self.streams else self.prompt_len - 1)
        self.streams.append(tokens)
        self._index(len(self.streams) - 1)

    def texts(self, stream: int) -> list[list[int]]:
        """The outputs of the group's other streams (the latest `MAX_TEXTS`), for a request that leaves with
        `stream` to take along."""
        p = self.prompt_len
        return [list(t[p:]) for s, t in enumerate(self.streams) if s != stream and len(t) > p][-MAX_TEXTS:]

    def leave(self, stream: int) -> None:
        """Its request left: index what it wrote last; its text stays for the siblings still here."""
        self._index(stream)
        self.live.discard(stream)
        self.members -= 1

    def catch_up(self) -> None:
        """Index what the live streams gained since the last call."""
        for s in self.live:
            self._index(s)

    def _index(self, s: int) -> None:
        """The n-grams of stream `s` ending where a continuation is known (before its last token): every entry
        can be followed, and a request never matches its own end."""
        tokens, index, base = self.streams[s], self.index, s * PLACE
        places, earlier = self.places, self.earlier
        end = len(tokens) - 1
        for p in range(self.indexed[s], end):
            for n in range(MIN_NGRAM, min(MAX_NGRAM, p + 1) + 1):
                key = tuple(tokens[p - n + 1 : p + 1])
                earlier.append(index.get(key, -1))
                index[key] = len(places)
                places.append(base + p)
        self.indexed[s] = max(self.indexed[s], end)

    def propose(self, stream: int, k: int) -> list[int]:
        """Up to `k` tokens to follow stream `stream` (once the index has caught up), from the latest places
        its longest indexed n-gram ends."""
        tokens, streams = self.streams[stream], self.streams
        length = len(tokens)
        places: list[tuple[int, int]] = []  # (stream, position of the token it would propose next)
        for n in range(min(MAX_NGRAM, length), MIN_NGRAM - 1, -1):
            entry = self.index.get(tuple(tokens[length - n :]), -1)
            while entry >= 0 and len(places) < MAX_MATCHES:  # the latest first
                places.append(divmod(self.places[entry] + 1, PLACE))
                entry = self.earlier[entry]
            if places:
                break
        draft: list[int] = []
        while places and len(draft) < k:
            token = Counter(streams[s][q] for s, q in places).most_common(1)[0][0]  # the latest on a tie
            draft.append(token)
            places = [(s, q + 1) for s, q in places if streams[s][q] == token and q + 1 < len(streams[s])]
        return draft

    def record(self, accepted: int, verified: int) -> None:
        """Draft outcomes into the running acceptance: `accepted` accepted, then one rejected if fewer than
        `verified` were (the tokens after a rejection were never judged)."""
        w = ACCEPTANCE_WEIGHT
        for _ in range(accepted):
            self.acceptance += w * (1.0 - self.acceptance)
        if accepted < verified:
            self.acceptance -= w * self.acceptance


class Drafter:
    """The engine's groups by prompt (the same key that links a group's samples for one prefill)."""

    def __init__(self) -> None:
        self.groups: dict[tuple[int, ...], GroupText] = {}

    def join(self, request_id: str, tokens: list[int], prompt_len: int) -> tuple[GroupText, int]:
        key = tuple(tokens[:prompt_len])
        group = self.groups.get(key)
        if group is None:
            group = self.groups[key] = GroupText(prompt_len)
        return group, group.join(request_id, tokens)

    def leave(self, group: GroupText, stream: int, tokens: list[int]) -> None:
        """A request left (finished, aborted, moved): its text stays for its siblings while any is here."""
        group.leave(stream)
        if group.members == 0:
            del self.groups[tuple(tokens[: group.prompt_len])]


def next_draft_len(draft_len: int, accepted: int, drafted: int, max_draft: int) -> int:
    """A request's next draft length from its last verify: two more after a draft accepted whole, one less
    (at least one) after a rejection."""
    if accepted == drafted:
        return min(max_draft, draft_len + 2)
    return max(1, draft_len - 1)
