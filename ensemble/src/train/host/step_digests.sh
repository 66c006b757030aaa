#!/bin/sh
# Prints the host training step's digests on this machine (see
# `the_step_keeps_its_bits` in tests.rs, which pins them per instruction set).
exec env PRIVMIX_PRINT_STEP_DIGESTS=1 cargo test -p privmix-ensemble --lib \
  train::host::tests::the_step_keeps_its_bits -- --nocapture
