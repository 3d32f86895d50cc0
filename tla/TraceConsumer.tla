--------------------------- MODULE TraceConsumer ---------------------------
(***************************************************************************)
(* Trace validation: is a trace written by `htmqc run --trace` a behaviour *)
(* of Consumer.tla?                                                        *)
(*                                                                         *)
(* What is verified                                                        *)
(*   TLC explores the behaviours of Consumer.tla whose every step is the   *)
(*   spec action named by the next trace line, with that line's partition  *)
(*   and offset, and whose member view then shows what the line recorded:  *)
(*   next, processed, committed, requested, unsent, the offsets finished   *)
(*   above the watermark and the assignment's epoch                        *)
(*   (checked at the last line of each batch: the runtime writes one line  *)
(*   per offset with the state after the batch). A commit_requested line   *)
(*   must hand out exactly the spec's commit (offset, finished_above,      *)
(*   epoch, and the fence token the member got at its claim).              *)
(*   The invariant TraceUnmatched (i < Len(Trace)) is *expected to fail*:  *)
(*   TLC reporting it violated means a behaviour matching every line       *)
(*   exists (the trace is accepted). If TLC ends without that violation,   *)
(*   no behaviour of the spec produces the trace (rejected); each new      *)
(*   deepest line matched is printed as <<"deepest", N>> (register 1).     *)
(*   The spec's own invariants (TypeOK, OffsetOrder, WorkTagged, NoLoss    *)
(*   and, exactly-once, NoDuplicateEffect) are checked on the way.         *)
(*                                                                         *)
(* The trace comes as constants of a module that model_checks/             *)
(* trace_validation.py generates for each run (TLC 2.15 has no Json or     *)
(* IOUtils module): Trace, one record a line                               *)
(*   [ev, p, off (-1 for none), offs (fetched: the batch's offsets),       *)
(*    check (last line of its batch), held (the line carries a state),     *)
(*    next, processed, committed, requested, unsent, fa (finished above),  *)
(*    epoch (the core's), above (assign: held by the sink; commit_requested*)
(*    : the commit's finished_above), fence (-1 for none)]                 *)
(* and the model's constants (Log, End, ...) derived from it. offs, fa and *)
(* above are sequences holding the line's list as written: the spec        *)
(* compares them with its sets through Lists (each offset once, in         *)
(* increasing order), so a repeated offset cannot hide in a set.           *)
(*                                                                         *)
(* Epochs. The core numbers assignments per process, the spec per         *)
(* partition; cepoch[p] is the core epoch of M's current assignment of p   *)
(* (recorded at its assign line, which must carry a fresh, larger number), *)
(* and every later line of p must carry it.                                *)
(*                                                                         *)
(* Hand-offs. A trace with handed_off lines gets one retry partition      *)
(* (RetryPartition, not in the trace: the trace does not say where each   *)
(* record went) with RetryCap = the number of hand-offs.                   *)
(*                                                                         *)
(* Steps the trace does not record (spec/refinement.md)                    *)
(*   - session expiry: a member cannot see it; a hidden SessionExpired     *)
(*     step is allowed just before a `revoked` line (RevokedLost);         *)
(*   - claims of p by other members (the fence token jumps): a hidden      *)
(*     FenceJump step, only while M does not hold p and only up to the     *)
(*     fence of the next assign line of p;                                 *)
(* The trace belongs to one member, M. Its first assignment of p starts    *)
(* at Start[p] (StartAbove[p] above it): earlier members finished what is  *)
(* below, so TraceInit is Init with those positions durable and done.      *)
(***************************************************************************)
EXTENDS Consumer, Integers, Sequences, TLC

CONSTANTS
    Trace,         \* the trace lines (records, see above)
    M,             \* the member that wrote the trace (model value)
    Start,         \* Start[p]: durable position of p when the trace begins
    StartAbove,    \* StartAbove[p]: offsets above Start[p] already stored
    FirstFence     \* FirstFence[p]: the fence of p's first assign line (0: none)

VARIABLES
    i,             \* trace lines matched so far
    cepoch,        \* cepoch[p]: the core epoch of M's current assignment of p
    top            \* the largest core epoch seen so far

traceVars == <<vars, i, cepoch, top>>

TraceInit ==
    /\ owner = [p \in Partitions |-> NoMember]
    /\ epoch = [p \in Partitions |-> 0]
    /\ fence = [p \in Partitions |-> IF FirstFence[p] > 0 THEN FirstFence[p] - 1 ELSE 0]
    /\ down = {}
    /\ view = [m \in Members |-> [p \in Partitions |-> NoView]]
    /\ work = [m \in Members |-> {}]
    /\ net = {}
    /\ durable = Start
    /\ durableAbove = StartAbove
    /\ effects = [p \in Partitions |-> [o \in Offsets |->
                     IF o < Start[p] \/ o \in StartAbove[p] THEN 1 ELSE 0]]
    /\ dead = [p \in Partitions |-> {}]
    /\ crashes = 0
    /\ expiries = 0
    /\ gate = [m \in Members |-> [p \in Partitions |-> "Unassigned"]]
    /\ told = [m \in Members |-> [p \in Partitions |-> "unknown"]]
    /\ kpaused = [m \in Members |-> [p \in Partitions |-> FALSE]]
    /\ holds = [m \in Members |-> {}]
    /\ breaker = [m \in Members |-> "Closed"]
    /\ trips = 0
    /\ races = 0
    /\ rlog = <<>>
    /\ rdue = {}
    /\ i = 0
    /\ cepoch = [p \in Partitions |-> 0]
    /\ top = 0
    /\ TLCSet(1, 0)

-----------------------------------------------------------------------------
(***************************************************************************)
(* One trace line, one spec step                                           *)
(***************************************************************************)
V(p) == view[M][p]

\* The line's offset list s lists the spec's set S: every offset of S once,
\* in increasing order (as the runtime writes every offset list).
Lists(s, S) == /\ {s[k] : k \in DOMAIN s} = S
               /\ \A k \in 1..(Len(s) - 1) : s[k] < s[k + 1]

\* The recorded state after the line (only at the end of a batch).
StateMatches(l) ==
    l.check =>
        IF l.held
        THEN LET v == view'[M][l.p] IN
             /\ v.held
             /\ v.next = l.next
             /\ Processed(v) = l.processed
             /\ v.committed = l.committed
             /\ v.requested = l.requested
             /\ v.unsent = l.unsent
             /\ Lists(l.fa, FinishedAbove(v))
             /\ cepoch'[l.p] = l.epoch
        ELSE ~view'[M][l.p].held

\* A step that changes nothing the spec sees.
Stutter == UNCHANGED vars

\* The epoch bookkeeping of a line: an assign line brings a fresh core epoch,
\* every other line keeps p's.
Epochs(l) ==
    IF l.ev = "assign"
    THEN /\ l.epoch > top
         /\ cepoch' = [cepoch EXCEPT ![l.p] = l.epoch]
         /\ top' = l.epoch
    ELSE UNCHANGED <<cepoch, top>>

\* The token of M's claim of p is the fence the line recorded (exactly-once).
FenceMatches(l) == l.fence < 0 \/ view'[M][l.p].token = l.fence

\* The line is one of the assign lines that follow the last crash (after the
\* first, whose Restored step claimed every partition M owns) and the first
\* to name l.p since that crash.
RestoredNotAnnounced(l) ==
    \E c \in 1..i :
       /\ Trace[c].ev = "crashed"
       /\ \A k \in (c + 1)..i : Trace[k].ev = "assign" /\ Trace[k].p # l.p

\* Every claim starts from the durable position: the line's offset and the
\* offsets stored as finished above it.
AssignStep(l) ==
    /\ durable[l.p] = l.off /\ Lists(l.above, durableAbove[l.p])
    /\ \/ M \notin down /\ Assign(M, l.p)
       \/ M \in down /\ owner[l.p] = M /\ Restored(M)
       \* the other partitions of one Restored step (already fresh in the view)
       \/ /\ M \notin down /\ RestoredNotAnnounced(l)
          /\ V(l.p).held /\ V(l.p).next = l.off /\ V(l.p).committed = l.off
          /\ \A o \in Offsets : V(l.p).st[o] = "None"
          /\ Stutter
    /\ FenceMatches(l)

FetchedStep(l) ==
    /\ Lists(l.offs, {o \in V(l.p).next..(l.next - 1) : o \in Log[l.p]})
    /\ Fetched(M, l.p)
    /\ view'[M][l.p].next = l.next

\* The running handler of offset o in M's current assignment of p.
Handler(p, o) == [p |-> p, o |-> o, epoch |-> V(p).epoch]

\* failed: the next line says whether the core scheduled a retry.
FailedStep(l) ==
    /\ Failed(M, Handler(l.p, l.off))
    /\ view'[M][l.p].st[l.off] =
         IF /\ i + 2 <= Len(Trace)
            /\ Trace[i + 2].ev = "retry_scheduled"
            /\ Trace[i + 2].p = l.p /\ Trace[i + 2].off = l.off
         THEN "Retrying" ELSE "Failed"

CommitRequestedStep(l) ==
    /\ CommitOffset(V(l.p)) = l.off
    /\ Lists(l.above, FinishedAbove(V(l.p)))
    /\ cepoch[l.p] = l.epoch
    /\ l.fence < 0 \/ V(l.p).token = l.fence
    /\ CommitRequested(M, l.p)

AckStep(l) ==
    \E msg \in net :
       /\ msg.off = l.off
       /\ AckDelivered(M, l.p, msg, FALSE)

CommitFailedStep(l) ==
    /\ \E msg \in net : /\ msg.member = M /\ msg.part = l.p /\ ~msg.ok
                        /\ msg.off = l.off /\ net' = net \ {msg}
    /\ CommitFailed(M, l.p)

CrashedStep(l) ==
    IF M \in down THEN Stutter ELSE Crashed(M)

Step(l) ==
    CASE l.ev = "assign"           -> AssignStep(l)
      [] l.ev = "fetched"          -> FetchedStep(l)
      [] l.ev = "started"          -> Started(M, l.p, l.off)
      [] l.ev = "succeeded"        -> Succeeded(M, Handler(l.p, l.off))
      [] l.ev = "failed"           -> FailedStep(l)
      [] l.ev = "retry_scheduled"  -> V(l.p).st[l.off] = "Retrying" /\ Stutter
      [] l.ev = "retry_due"        -> RetryDue(M, l.p, l.off)
      [] l.ev = "dead_lettered"    -> DeadLettered(M, l.p, l.off)
      [] l.ev = "handed_off"       -> HandedOff(M, l.p, l.off)
      [] l.ev = "commit_requested" -> CommitRequestedStep(l)
      [] l.ev = "commit_acked"     -> AckStep(l)
      [] l.ev = "commit_failed"    -> CommitFailedStep(l)
      [] l.ev = "revoking"         -> Revoking(M, l.p)
      [] l.ev = "revoked"          -> Revoked(M, l.p) \/ RevokedLost(M, l.p)
      [] l.ev = "crashed"          -> CrashedStep(l)
      [] OTHER                     -> FALSE

TraceStep ==
    /\ i < Len(Trace)
    /\ Step(Trace[i + 1])
    /\ Epochs(Trace[i + 1])
    /\ StateMatches(Trace[i + 1])
    /\ i' = i + 1
    /\ IF i' > TLCGet(1) THEN TLCSet(1, i') /\ PrintT(<<"deepest", i'>>) ELSE TRUE

\* Another member claims p (the sink's fence moves on) while M does not hold it.
FenceJump(p) ==
    /\ ~Holds(M, p)
    /\ fence' = [fence EXCEPT ![p] = @ + 1]
    /\ UNCHANGED <<owner, epoch, down, view, work, net, durable, durableAbove,
                   effects, dead, crashes, expiries, gateVars, retryVars>>

\* Steps the trace cannot show (see the header).
HiddenStep ==
    /\ i < Len(Trace)
    /\ LET l == Trace[i + 1] IN
       \/ /\ l.ev = "revoked"
          /\ SessionExpired(M)
       \/ /\ l.ev = "assign" /\ l.fence > fence[l.p] + 1
          /\ FenceJump(l.p)
    /\ UNCHANGED <<i, cepoch, top>>

TraceNext == TraceStep \/ HiddenStep

TraceSpec == TraceInit /\ [][TraceNext]_traceVars

\* Expected to be violated: TLC then shows a behaviour matching the whole trace.
TraceUnmatched == i < Len(Trace)
=============================================================================
