"""ElasticStepSampler alone, no processes (test_elastic_lightning.py): 3 ranks, a step discarded
by a change, the rest of the epoch on 2; every sample of the epoch trained once, every rank the
same number of steps, len() what Lightning must count. Prints "ok"."""

from cohort.lightning import ElasticStepSampler

n, b = 100, 4
ranks = [ElasticStepSampler(n, b, r, 3, shuffle=True, seed=5) for r in range(3)]
its = [iter(s) for s in ranks]
assert {len(s) for s in ranks} == {-(-n // (b * 3)) * b}
trained: list[int] = []
fetched = 0

def step(live):
    out = []
    for i in live:
        batch = [x for _, x in zip(range(b), its[i])]
        out.append(batch)
    return out

for _ in range(2):  # two committed steps on 3 ranks
    batches = step([0, 1, 2])
    fetched += 1
    for s in ranks:
        s.commit(fetched)
    trained += [x for bt in batches for x in bt]
step([0, 1, 2])  # the third is met by a change: discarded everywhere
fetched += 1
for s in ranks[:2]:
    s.discard(fetched)
for new_rank, s in enumerate(ranks[:2]):  # rank 2 lost
    s.reshard(new_rank, 2)
live_steps = ranks[0].steps()
assert ranks[1].steps() == live_steps == fetched + -(-(n - 2 * b * 3) // (b * 2))
while True:
    batches = step([0, 1])
    assert len({len(bt) for bt in batches}) == 1, batches  # the ranks run the same steps
    if not batches[0]:
        break
    fetched += 1
    for s in ranks[:2]:
        s.commit(fetched)
    trained += [x for bt in batches for x in bt]
assert fetched == live_steps
assert sorted(set(trained)) == list(range(n))  # every sample of the epoch, none skipped
assert len(trained) - n <= 1  # and none twice, but the last step's padding
print("ok")
