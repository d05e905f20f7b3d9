# frozen_string_literal: true

Gem::Specification.new do |s|
  s.name = "lockd"
  s.version = "0.1.0"
  s.summary = "A client of lockd's line protocol, with the standard library only"
  s.description = "Locks with leases and fencing tokens, failover across front-ends, TLS, AUTH, " \
                  "STATUS and WATCH as structs, and with_lock: a block under the lock, renewed in the background."
  s.authors = ["lockd developers"]
  # lockd's licence is MIT OR Apache-2.0: the user's choice of either.
  s.licenses = ["MIT", "Apache-2.0"]
  # No homepage: the project has no public URL (gem build warns "no homepage specified").
  s.files = ["lib/lockd.rb", "README.md"]
  s.require_paths = ["lib"]
  s.required_ruby_version = ">= 3.0"
end
