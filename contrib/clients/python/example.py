"""The README's example: a body run under the lock, renewed in the background
(test_example.py runs it against a real lockd)."""


def deploy(token):
    return "deployed with fencing token %d" % token


def example():
    # README begin
    from lockd_client import lock

    with lock("deploy", ttl=30) as token:  # $LOCKD_ADDR, or 127.0.0.1:5001
        done = deploy(token)  # LeaseLost is raised at the end if the lease was lost
    # README end
    return done
