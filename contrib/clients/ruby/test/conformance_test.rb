# frozen_string_literal: true

# The conformance scenarios (../../conformance/scenarios.json; its README says the format),
# played by this client against a real lockd per scenario:
# ruby -Ilib -e 'Dir["test/*_test.rb"].each { |f| require_relative f }'
# LOCKD_BIN names the binary (default: the repository's target/release/lockd, then
# target/debug/lockd). A lock step's "and" names are #lock_tokens' and:, a detail entry's "and"
# its Holder's or Waiter's +and+.

require "minitest/autorun"
require "json"
require "open3"
require "tmpdir"
require "lockd"

module Conformance
  HERE = __dir__
  ROOT = File.expand_path("../../../..", HERE)
  DIR = File.expand_path("../../conformance", HERE)
  DOC = JSON.parse(File.read(File.join(DIR, "scenarios.json")))
  GUARD = 10.0

  def self.bin
    [ENV["LOCKD_BIN"], "#{ROOT}/target/release/lockd", "#{ROOT}/target/debug/lockd"].find { |p| p && File.exist?(p) } or
      raise "no lockd: set LOCKD_BIN or build it (cargo build)"
  end

  # Waits for +done+ (a Queue) to give something, at most GUARD seconds.
  def self.within(queue, what)
    deadline = Lockd.now + GUARD
    while queue.empty?
      raise Minitest::Assertion, "#{what} within #{GUARD}s" if Lockd.now > deadline

      sleep 0.01
    end
    queue.pop
  end

  # Forwards a port to lockd until cut; then passes nothing and closes nothing.
  class Proxy
    attr_reader :addr
    attr_accessor :cut

    def initialize(host, port)
      @server = TCPServer.new("127.0.0.1", 0)
      @addr = "127.0.0.1:#{@server.addr[1]}"
      @cut = false
      @mutex = Mutex.new
      @through = []
      @thread = Thread.new do
        loop do
          inner = @server.accept
          outer = TCPSocket.new(host, port)
          @mutex.synchronize { @through.push(inner, outer) }
          [[inner, outer], [outer, inner]].each { |a, b| Thread.new { pump(a, b) } }
        end
      rescue IOError, SystemCallError
        nil
      end
    end

    def pump(src, dst)
      loop do
        data = src.readpartial(4096)
        return if @cut

        dst.write(data)
      end
    rescue IOError, SystemCallError
      dst.close unless @cut
    end

    # Closes every connection through it, both sides.
    def drop
      @mutex.synchronize { @through.each(&:close).clear }
    end

    def close
      @server.close
    end
  end

  class World
    attr_reader :addr

    def initialize(scenario, tmp)
      @tmp = tmp
      @args = []
      @clients = {}
      @tokens = {}
      @pending = {}
      @holds = {}
      @watches = {}
      server = scenario["server"] || {}
      if server["tls"]
        @pki = tmp
        system(File.join(DIR, "make-pki"), tmp, exception: true)
        @args += ["--tls-cert", "#{tmp}/server.pem", "--tls-key", "#{tmp}/server.key", "--tls-client-ca", "#{tmp}/ca.pem"]
      end
      if server["auth"]
        text = DOC["users"].map do |user, u|
          out, status = Open3.capture2(Conformance.bin, "--auth-hash", "#{user} #{u['rights']}", stdin_data: "#{u['secret']}\n")
          raise "lockd --auth-hash failed" unless status.success?

          out
        end
        File.write("#{tmp}/users", text.join)
        @args += ["--auth-file", "#{tmp}/users"]
      end
      start("127.0.0.1:0")
    end

    def start(listen)
      env = ENV.keys.select { |k| k.start_with?("LOCKD_") || k == "RUST_LOG" }.to_h { |k| [k, nil] }
      r, w = IO.pipe
      @pid = Process.spawn(env, Conformance.bin, "--listen", listen, *@args, err: w, out: File::NULL)
      w.close
      deadline = Lockd.now + GUARD
      until @addr_found
        raise "lockd did not say where it listens" if Lockd.now > deadline || !(line = r.gets)

        m = /listening.*?(\d+\.\d+\.\d+\.\d+:\d+)/.match(line)
        @addr, @addr_found = m[1], true if m
      end
      @addr_found = false
      Thread.new { r.each_line { nil } }
    end

    def stop
      @clients.each_value(&:close)
      @watches.each_value(&:close)
      @proxy&.close
      @fakes&.each(&:close)
      Process.kill("CONT", @pid)
      Process.kill("KILL", @pid)
      Process.wait(@pid)
    end

    # A fake front-end cut off from etcd: OK PONG to PING, ERR UNAVAILABLE to everything else.
    def unavailable
      fake = TCPServer.new("127.0.0.1", 0)
      (@fakes ||= []) << fake
      Thread.new do
        loop do
          conn = fake.accept
          Thread.new do
            conn.each_line do |line|
              conn.write(line.strip.casecmp?("PING") ? "OK PONG\n" : "ERR UNAVAILABLE etcd has no leader; try again\n")
            end
          rescue IOError, SystemCallError
            nil
          end
        end
      rescue IOError, SystemCallError
        nil
      end
      "127.0.0.1:#{fake.addr[1]}"
    end

    def proxy
      @proxy ||= Proxy.new(*@addr.split(":").then { |h, p| [h, p.to_i] })
    end

    def options(name, step)
      addrs = (step["addrs"] || ["lockd"]).map do |a|
        next proxy.addr if a == "proxy"
        next unavailable if a == "unavailable"
        next @addr unless a == "dead"

        s = TCPServer.new("127.0.0.1", 0)
        "127.0.0.1:#{s.addr[1]}".tap { s.close }
      end
      addrs = [proxy.addr] if step["via"] == "proxy"
      o = { addrs: addrs, id: name, timeout: 5.0, tls: false }
      o.delete(:id) if step["id"] == "default"
      o.merge!(tls: true, ca: "#{@pki}/ca.pem", cert: "#{@pki}/client.pem", key: "#{@pki}/client.key") if @pki
      if (user = step["user"])
        o[:user] = user
        secret = DOC["users"][user]["secret"]
        case step["secret"]
        when "env" then ENV["LOCKD_SECRET"] = secret # read by Client.new, deleted after it
        when "file" then File.write(o[:secret_file] = "#{@tmp}/#{user}.secret", "#{secret}\n")
        else o[:secret] = "not-the-secret-0123456789"
        end
      end
      o
    end

    def token(v)
      v.is_a?(String) ? @tokens.fetch(v) : v
    end

    def outcome(step)
      got = yield
      raise Minitest::Assertion, "answered #{got.inspect}; expected #{step['expect']}" if step["expect"]

      (step["result"] || {}).each do |k, v|
        want = k == "token" ? token(v) : v
        want = v.map { |x| x.is_a?(Hash) && x["token"] ? x.merge("token" => token(x["token"])) : x } if v.is_a?(Array)
        have = got.is_a?(Struct) ? got.to_h.transform_keys(&:to_s) : got
        raise Minitest::Assertion, "answered #{got.inspect}; expected #{k}=#{want.inspect}" unless have[k] == want
      end
    rescue Lockd::ServerError => e
      raise Minitest::Assertion, "#{e.message}; expected #{step['expect'] || 'success'}" unless e.code == step["expect"]
      # The typed error: the class of its code.
      raise Minitest::Assertion, "#{e.class} for #{e.code}" unless e.is_a?(Lockd::CODES.fetch(e.code))
    end

    def lock(s)
      c = @clients.fetch(s["client"])
      box = { done: Queue.new, names: [s["name"], *s["and"]] }
      sec = ->(k) { s[k] && s[k] / 1000.0 }
      @pending[s["as"] || "_"] = box
      Thread.new do
        box[:tokens] = c.lock_tokens(s["name"], ttl: sec["ttl_ms"], wait: sec["wait_ms"], session: s["session"] || false,
                                                grace: sec["grace_ms"], shared: s["shared"] || false, limit: s["limit"],
                                                supersede: s["supersede"] || false, note: s["note"], and: s["and"] || [])
      rescue Lockd::Error => e
        box[:error] = e
      ensure
        box[:at] = Lockd.now
        box[:done] << true
      end
      wait_for(s["as"] || "_", s) unless s["async"]
    end

    def wait_for(of, s)
      box = @pending.fetch(of)
      Conformance.within(box[:done], "the LOCK #{of} answered")
      box[:done] << true # for a later look
      outcome(s) do
        raise box[:error] if box[:error]

        tokens = box[:tokens]
        raise Minitest::Assertion, "granted #{tokens} for #{box[:names]}" unless tokens.size == box[:names].size

        # +of+ is the first name's token, "of.<name>" each name's.
        @tokens[of] = tokens.first
        box[:names].zip(tokens) { |n, t| @tokens["#{of}.#{n}"] = t }
      end
    end

    def hold(s)
      c = Lockd::Client.new(**options(s["client"], s))
      h = { end: Queue.new, lost: Queue.new, result: Queue.new, ttl: s["ttl_ms"] / 1000.0, got: Queue.new }
      got = h[:got]
      @holds[s["as"]] = h
      Thread.new do
        c.with_lock(s["name"], ttl: h[:ttl]) do |token|
          @tokens[s["as"]] = token
          got << true
          begin
            h[:end].pop
          rescue Lockd::LeaseLost
            h[:lost_at] = Lockd.now
            h[:lost] << true
            raise
          end
        end
        h[:result] << nil
      rescue StandardError => e
        h[:result] << e
        got << false
      end
      granted(h) unless s["async"]
    end

    # Waits for the block of the hold +h+ to run (its token saved under its "as").
    def granted(h)
      raise Minitest::Assertion, "with_lock failed: #{h[:result].pop.inspect}" unless Conformance.within(h[:got], "the helper holds the lock")

      h[:got] << true # for a later look
    end

    def step(s)
      c = @clients[s["client"]]
      case s["op"]
      when "connect"
        o = options(s["client"], s)
        begin
          c = @clients[s["client"]] = Lockd::Client.new(**o)
        ensure
          ENV.delete("LOCKD_SECRET")
        end
        outcome(s) { c.connect }
      when "lock" then lock(s)
      when "await" then @holds[s["of"]] ? granted(@holds[s["of"]]) : wait_for(s["of"], s)
      when "pending"
        sleep((s["ms"] || 300) / 1000.0)
        if (h = @holds[s["of"]])
          raise Minitest::Assertion, "the helper #{s['of']} runs (or failed); it should still wait" unless h[:got].empty?
        else
          raise Minitest::Assertion, "the LOCK #{s['of']} was answered; it should still wait" unless @pending.fetch(s["of"])[:done].empty?
        end
      when "distinct"
        tokens = s["tokens"].map { |t| @tokens.fetch(t) }
        raise Minitest::Assertion, "#{s['tokens']} are #{tokens}: not all different" unless tokens.uniq.size == tokens.size
      when "unlock" then outcome(s) { c.unlock(s["name"], token(s["token"])) }
      when "renew", "check"
        outcome(s) do
          left = s["op"] == "renew" ? c.renew(s["name"], token(s["token"]), ttl: s["ttl_ms"] && s["ttl_ms"] / 1000.0) : c.check(s["name"], token(s["token"]))
          raise Minitest::Assertion, "no lease left" unless left.positive?
        end
      when "status"
        outcome(s) { c.status(s["name"]).to_h.compact.transform_keys(&:to_s).then { |h| h["free"] ? { "free" => true } : h } }
      when "status_all" then outcome(s) { { "names" => c.status_all.map(&:name) } }
      when "detail"
        outcome(s) do
          d = c.detail(s["name"])
          next({ "free" => true }) if d.status.free

          # A set's other names ("and") are named only where it has them (the lists compare whole).
          also = ->(x) { x.and.empty? ? {} : { "and" => x.and } }
          { "holders" => d.holders.map { |x| { "id" => x.id, "token" => x.token, "mode" => x.mode, **also[x] } },
            "waiters" => d.waiters.map { |x| { "id" => x.id, "position" => x.position, "mode" => x.mode, **also[x] } } }
        end
      when "watch" then outcome(s) { @watches[s["client"]] = c.watch(s["name"]) }
      when "event"
        outcome(s) { @watches.fetch(s["client"]).next(GUARD).to_h.transform_keys(&:to_s) }
      when "hold" then hold(s)
      when "end"
        h = @holds.fetch(s["of"])
        h[:end] << true
        e = Conformance.within(h[:result], "the helper returned")
        raise Minitest::Assertion, "the helper failed: #{e.inspect}" if e
      when "lost"
        h = @holds.fetch(s["of"])
        Conformance.within(h[:lost], "the loss signalled")
        e = Conformance.within(h[:result], "the helper returned after the loss")
        raise Minitest::Assertion, "the helper ended with #{e.inspect}" unless e.is_a?(Lockd::LeaseLost)

        if s["before"]
          at = @pending.fetch(s["before"])[:at]
          raise Minitest::Assertion, format("signalled %.3fs after the grant", h[:lost_at] - at) unless h[:lost_at] < at
        end
        if s["within_ttl_of_freeze"] && h[:lost_at] > @froze_at + h[:ttl]
          raise Minitest::Assertion, format("signalled %.3fs after the freeze", h[:lost_at] - @froze_at)
        end
      when "sleep" then sleep(s["ms"] / 1000.0)
      when "freeze"
        @froze_at = Lockd.now
        Process.kill("STOP", @pid)
        sleep(s["ms"] / 1000.0)
        Process.kill("CONT", @pid)
      when "cut" then @proxy.cut = true
      when "drop" then @proxy.drop
      when "restart"
        Process.kill("KILL", @pid)
        Process.wait(@pid)
        start(@addr)
      else raise "unknown op #{s['op']}"
      end
    end
  end

  class Test < Minitest::Test
    i_suck_and_my_tests_are_order_dependent! # one lockd at a time: scenarios assert timing loosely

    DOC["scenarios"].each do |scenario|
      define_method("test_#{scenario['name']}") do
        Dir.mktmpdir("lockd-conformance-") do |tmp|
          world = World.new(scenario, tmp)
          begin
            scenario["steps"].each_with_index do |step, i|
              world.step(step)
            rescue Minitest::Assertion, StandardError => e
              raise Minitest::Assertion, "step #{i + 1} #{step.to_json}: #{e.message}"
            end
            pass # every step held
          ensure
            world.stop
          end
        end
      end
    end
  end
end
