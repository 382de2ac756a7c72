"""What an elastic reset changed, for the line rank 0 prints about it: lm_ptb_elastic.py's alone,
so beside it, not in utils/ (which holds nothing about distribution).

Plain Python, no Horovod: every worker keeps a Membership; after each (re)start the script
gathers every worker's `mine()` and hands the list to `start()`. New workers know nothing, so
the answer comes from those that were already there, and all workers agree on it."""
import collections


class Membership:
    def __init__(self, host):
        self.host = host  # as the elastic driver names it (HOROVOD_HOSTNAME)
        self.hosts = None  # every worker's host at the last (re)start; None: a new worker
        self.at = None  # (epoch, step) of the last step trained; epoch counted from 1
        self.rolled_back = []  # this epoch's steps that resets discarded: [(workers, steps)]

    def mine(self):
        return self.host, self.hosts, self.at, self.rolled_back

    def counting(self, epoch, after_step=None):
        """An after_step for train_epoch (epoch from 0) that notes each step, then calls
        `after_step`."""
        def note(done, steps):
            self.at = (epoch + 1, done)
            if after_step:
                after_step(done, steps)
        return note

    def start(self, gathered, position):
        """gathered: every worker's mine(), after they (re)started together; position: the
        commit they go on from (a checkpoints.Position). Returns None on the job's first start,
        else what the reset changed: the event rank 0 logs."""
        hosts = [g[0] for g in gathered]
        known = [g for g in gathered if g[1] is not None]
        self.hosts = hosts
        if not known:
            return None
        before = known[0][1]
        self.rolled_back = list(known[0][3])
        epoch = position.epochs_done + 1
        # the steps past the commit in the epoch it is inside: lost if the reset restored it
        reached = [at[1] for _, _, at, _ in known if at and at[0] == epoch]
        lost_steps = max(max(reached, default=0) - position.step, 0)
        if lost_steps:
            self.rolled_back.append((len(before), lost_steps))
        was, now = collections.Counter(before), collections.Counter(hosts)
        return {"workers_before": len(before), "workers_after": len(hosts),
                "lost": sorted((was - now).elements()), "added": sorted((now - was).elements()),
                "epoch": epoch, "step": position.step, "rolled_back_steps": lost_steps}

    def epoch_done(self):
        """The epoch's rolled-back work, [(workers, steps)], forgotten for the next epoch."""
        rolled, self.rolled_back = self.rolled_back, []
        return rolled
