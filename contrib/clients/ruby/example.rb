# frozen_string_literal: true

# The README's example: a block run under the lock, renewed in the background
# (test/example_test.rb runs it against a real lockd).
require "lockd"

def deploy(token)
  "deployed with fencing token #{token}"
end

def example
  # README begin
  client = Lockd::Client.new # $LOCKD_ADDR, or 127.0.0.1:5001
  done = client.with_lock("deploy", ttl: 30) do |token|
    deploy(token) # Lockd::LeaseLost is raised here the moment the lease is lost
  end
  client.close
  # README end
  done
end
