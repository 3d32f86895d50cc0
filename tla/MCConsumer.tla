----------------------------- MODULE MCConsumer -----------------------------
(***************************************************************************)
(* Model-checking module for Consumer.tla: small constant sets for TLC.    *)
(* The .cfg files next to it pick a size (small: CI, seconds; medium:      *)
(* make verify-long, minutes), a MODE and the mutant switches; each one's  *)
(* expected result and state counts are recorded in manifest.json.         *)
(***************************************************************************)
EXTENDS Consumer, TLC

\* small: one partition with a gap at offset 1 (offsets 0 and 2 present).
SmallPartitions == {"p1"}
SmallLog == [p \in SmallPartitions |-> {0, 2}]
SmallEnd == [p \in SmallPartitions |-> 3]

\* tiny: one message after a gap (for the costly runs: zombies, two workers,
\* liveness).
TinyLog == [p \in SmallPartitions |-> {1}]
TinyEnd == [p \in SmallPartitions |-> 2]

\* medium: two partitions, one with a gap, one with a single message.
MediumPartitions == {"p1", "p2"}
MediumLog == ("p1" :> {0, 2}) @@ ("p2" :> {0})
MediumEnd == ("p1" :> 3) @@ ("p2" :> 1)

\* The specification without fairness: AllFinished must fail (a member may
\* simply stop), which shows the liveness check can fail.
UnfairSpec == Init /\ [][Next]_vars

\* Members are interchangeable (safety configs only: symmetry is unsound
\* for liveness checking).
MemberSymmetry == Permutations(Members)
=============================================================================
