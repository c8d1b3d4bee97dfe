from benchmarks.large_batch.experiment import main

main()
