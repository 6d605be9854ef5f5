"""Train the toy model of notebook 11x (the backward's deep dive) and write its weights into the package.

    python scripts/train_toy_model.py        -> attention_lib/stages/data/toy_heads.npz

A two-layer, attention-only model (attention_lib.stages.toy_model) trained with Adam on the
induction task, seeded: the same weights on every run with the same NumPy. Prints the training
time, the loss along the way and the accuracy on a fresh seeded batch.
"""

import time

import numpy as np

from attention_lib.stages import toy_model

SEED = 0
STEPS = 400
TEST_SEED, TEST_BATCH = 99, 512


def main():
    start = time.perf_counter()
    params, history = toy_model.train(steps=STEPS, seed=SEED)
    seconds = time.perf_counter() - start
    tokens, scored, _ = toy_model.induction_batch(np.random.default_rng(TEST_SEED), TEST_BATCH)
    accuracy = toy_model.accuracy(params, tokens, scored)
    # float32 halves the file; the model is used for pictures and accuracy, not further training
    np.savez_compressed(toy_model.WEIGHTS, history=np.array(history),
                        **{name: value.astype(np.float32) for name, value in params.items()})
    print(f"trained {STEPS} steps in {seconds:.1f} s; loss " +
          ", ".join(f"{loss:.3g} (step {step})" for step, loss in history))
    print(f"accuracy on {TEST_BATCH} fresh sequences: {accuracy:.3f}; wrote {toy_model.WEIGHTS.name} "
          f"({toy_model.WEIGHTS.stat().st_size:,} bytes)")


if __name__ == "__main__":
    main()
