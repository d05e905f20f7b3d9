# frozen_string_literal: true

# A client of lockd's line protocol (proto.md) with the standard library only (socket,
# openssl): locks with leases and fencing tokens, renewals, STATUS and WATCH read into
# structs, failover across a cluster's front-ends, TLS and AUTH, and with_lock, which runs a
# block under the lock, renews in the background and raises Lockd::LeaseLost in the block's
# thread the moment the lease can no longer be trusted. LOCK takes a note for people (note:,
# shown with the holder, decoded, in STATUS and detail), supersede: (newest wins; the waiters
# it drops get Lockd::Superseded) and and: (a set of names, all at once; #lock_tokens gives a
# token per name). Durations are seconds (Float).

require "socket"
require "openssl"
require "monitor"

module Lockd
  DEFAULT_ADDR = "127.0.0.1:5001"
  DEFAULT_TTL = 30.0
  DEFAULT_GRACE = 10.0
  MAX_REPLY = 64 * 1024

  # Base of every error this library raises.
  class Error < StandardError; end

  # An ERR reply: +code+ is the protocol's word; each code has its subclass (Lockd::Timeout,
  # Lockd::NotHeld, Lockd::Unavailable, Lockd::Superseded, ...), so a caller rescues the one it
  # means. Lockd::Superseded: a waiting LOCK was dropped from the queue by a newer +supersede+
  # LOCK of another id (the holder keeps the lock; this request is over, not to be retried).
  class ServerError < Error
    attr_reader :code, :detail

    def initialize(code, detail)
      super(detail.to_s.empty? ? "ERR #{code}" : "ERR #{code} #{detail}")
      @code = code
      @detail = detail
    end
  end

  CODES = {}
  %w[SYNTAX UNKNOWN BADARG ENCODING TOOLONG TIMEOUT NOTHELD CONFLICT REPLACED LIMIT LAGGED
     SHUTDOWN NOAUTH DENIED UNAVAILABLE TLS SUPERSEDED].each do |code|
    name = { "BADARG" => "BadArg", "NOTHELD" => "NotHeld", "TOOLONG" => "TooLong",
             "NOAUTH" => "NoAuth", "TLS" => "TlsRefused", "ENCODING" => "BadEncoding" }.fetch(code, code.capitalize)
    CODES[code] = const_set(name, Class.new(ServerError))
  end

  def self.server_error(code, detail)
    CODES.fetch(code, ServerError).new(code, detail)
  end

  # No connection to lockd, or no reply from it. +final+: trying again would fail alike (TLS).
  class ConnectionError < Error
    attr_reader :final

    def initialize(message, final: false)
      super(message)
      @final = final
    end
  end

  # The lease ended while with_lock's block ran: its work is no longer exclusive.
  class LeaseLost < Error
    attr_reader :lock, :token, :reason

    def initialize(lock, token, reason)
      super("lease on #{lock} (token #{token}) lost: #{reason}")
      @lock = lock
      @token = token
      @reason = reason
    end
  end

  # +note+ (Status and Holder): the holder's note, decoded (nil for none); a Status's is its
  # first holder's. +and+ (Holder and Waiter): the other names of its set (the line's and=
  # fields, in the order its LOCK gave them: its one lease holds them too), [] for one name.
  Status = Struct.new(:name, :free, :id, :token, :ttl_ms, :session, :waiters, :holders, :mode, :note,
                      keyword_init: true)
  Holder = Struct.new(:name, :id, :token, :held_ms, :ttl_ms, :session, :mode, :user, :note, :and, keyword_init: true)
  Waiter = Struct.new(:name, :position, :id, :waited_ms, :session, :mode, :and, keyword_init: true)
  Detail = Struct.new(:status, :holders, :waiters, keyword_init: true)
  # +note+: the new holder's note (acquired events only, nil for none); +by+: who broke the
  # lease (broken events only).
  Event = Struct.new(:kind, :name, :id, :token, :unix_ms, :note, :by, keyword_init: true)

  @next_id = 0
  @next_id_lock = Mutex.new

  # A new holder's id: <hostname>:<pid>:<n>, n counting in this process.
  def self.default_id
    n = @next_id_lock.synchronize { @next_id += 1 }
    host = Socket.gethostname
    "#{host.empty? ? 'localhost' : host}:#{Process.pid}:#{n}"
  end

  def self.word(what, value)
    if !value.is_a?(String) || value.empty? || value.bytesize > 255 || value.match?(/[\x00-\x20\x7f]/)
      raise ArgumentError, "#{what} must be 1 to 255 bytes without whitespace or control characters: #{value.inspect}"
    end

    value
  end

  # A LOCK's note: printable UTF-8 text (spaces and non-ASCII included), sent as it is.
  def self.note(value)
    text = value.to_s.encode(Encoding::UTF_8)
    if !text.valid_encoding? || text.match?(/[\x00-\x1f\x7f]/)
      raise ArgumentError, "note must be printable UTF-8 text without control characters: #{value.inspect}"
    end

    text
  rescue EncodingError
    raise ArgumentError, "note must be printable UTF-8 text without control characters: #{value.inspect}"
  end

  # A note field's value as lockd sends it (%XX for each byte of a space, a %, a non-ASCII
  # character): the text, or nil for no note.
  def self.decode_note(field)
    return nil if field.nil? || field.empty?

    field.b.gsub(/%(\h\h)/) { Regexp.last_match(1).hex.chr }.force_encoding(Encoding::UTF_8)
  end

  def self.now
    Process.clock_gettime(Process::CLOCK_MONOTONIC)
  end

  def self.retryable?(e)
    return !e.final if e.is_a?(ConnectionError)

    e.is_a?(Unavailable) || e.is_a?(Shutdown)
  end

  def self.ms(seconds)
    "#{(seconds * 1000).round}ms"
  end

  # A connection to lockd, opened on first use and again after a failure. Requests run one at
  # a time (a waiting LOCK holds it): give each thread that waits its own Client (#dup).
  class Client
    attr_reader :id

    def initialize(addrs: nil, id: nil, timeout: 10.0, tls: nil, ca: nil, cert: nil, key: nil,
                   user: nil, secret: nil, secret_file: nil)
      @options = { addrs: addrs, timeout: timeout, tls: tls, ca: ca, cert: cert, key: key }
      addrs ||= ENV["LOCKD_ADDR"] || DEFAULT_ADDR
      addrs = addrs.split(",") if addrs.is_a?(String)
      @addrs = addrs.map do |a|
        m = /\A(\[[^\]]+\]|[^:\s]+):(\d+)\z/.match(a) or raise ArgumentError, "address must be host:port, not #{a.inspect}"
        [a, m[1].delete("[]"), m[2].to_i]
      end
      # Without an id, each LOCK takes a new one (Lockd.default_id): the same id is the same
      # client to lockd (a LOCK again is a retry, answered with the same grant), so two holders
      # in one process (threads, Clients, with_lock calls) never share one.
      @id = id && Lockd.word("id", id)
      @timeout = timeout
      @tls = tls_context(tls, ca, cert, key)
      credentials(user, secret, secret_file)
      @monitor = Monitor.new
      @sock = nil
      @at = @start = 0
    end

    # A Client with the same options and a connection of its own.
    def dup
      Client.new(**@options, id: @id, user: @user, secret: @secret)
    end

    def inspect
      "#<Lockd::Client #{@addrs.map(&:first).join(',')} id=#{@id || '(one per LOCK)'}>"
    end

    # Closes the connection (ending its session leases); the next request reconnects.
    def close
      @monitor.synchronize { drop(false) }
    end

    def connect
      request("PING")
      self
    end

    # LOCK: the fencing token, after waiting in the FIFO queue while the lock is held.
    # +wait+: seconds in the queue (0 tries once; nil waits as long as it takes). +session+:
    # the lease ends +grace+ seconds after the connection closes; otherwise +detach+ (the
    # default) ties only the wait to the connection. A LOCK whose connection is lost, or that
    # is answered ERR UNAVAILABLE or SHUTDOWN, is sent again (same id) through the next address
    # for the rest of its wait.
    # +note+: a short text for people (who holds it and why: "release 1.4.2 by ci job 8812"),
    # shown with the holder by STATUS, detail, WATCH's acquired events and refusals; printable
    # UTF-8, at most the server's --max-note bytes (default 256), else ArgumentError (a control
    # character) or Lockd::BadArg (too long). nil or "" sends none; a repeat LOCK of the same id
    # without one keeps the note it has. +supersede+: newest wins: if the LOCK must wait, every
    # request waiting on the name is answered Lockd::Superseded (the holder keeps the lock) and
    # this one waits at the head of the queue, alone; granted at once, it changes nothing.
    # +and+: further names of a set (proto.md, "Several names at once"), taken with +name+ all
    # at once or not at all, as one lease: every other option applies to each name, and a
    # renew, check or unlock of any one of them, with the token given for it, applies to the
    # whole set; a refusal of any name refuses the set and changes nothing. #lock returns the
    # first name's token, #lock_tokens every name's. Not with +supersede+.
    def lock(name, **options)
      lock_tokens(name, **options).first
    end

    # #lock, returning every name's token: +name+'s first, then those of +and+ in their order
    # (one for a LOCK of one name). Fence a write to each resource with the token given for its
    # name, and assume nothing about how they compare (today they are one number).
    def lock_tokens(name, ttl: nil, wait: nil, session: false, grace: nil, detach: true, shared: false, limit: nil,
                    supersede: false, note: nil, and: [])
      also = binding.local_variable_get(:and) # a keyword's name: read through the binding
      Lockd.word("name", name)
      raise ArgumentError, "and must be a list of names, not #{also.inspect}" unless also.is_a?(Array)

      also.each { |n| Lockd.word("name", n) }
      raise ArgumentError, "shared and limit exclude each other" if shared && limit
      raise ArgumentError, "supersede takes one name, not a set (and:)" if supersede && !also.empty?

      note = note && Lockd.note(note)

      head = "LOCK #{name} #{@id || Lockd.default_id}"
      head += " ttl=#{Lockd.ms(ttl)}" if ttl
      tail = if session then " session=#{Lockd.ms(grace || 0)}"
             elsif detach then " detach"
             else ""
             end
      tail += shared ? " shared" : limit ? " limit=#{Integer(limit)}" : ""
      tail += " supersede" if supersede
      tail += also.map { |n| " and=#{n}" }.join
      tail += " note=#{note}" if note && !note.empty? # last: it takes the rest of the line
      deadline = wait && Lockd.now + wait
      tries = 0
      begin
        tries += 1
        line = head
        limit_s = nil
        if deadline
          left = [deadline - Lockd.now, 0].max
          line += " wait=#{Lockd.ms(left)}"
          limit_s = left + @timeout
        end
        rest = request(line + tail, limit: limit_s)
        # OK <token> [<token2> ...]: one per name, in the request's order.
        tokens = rest.split(" ")
        unless tokens.size == 1 + also.size && tokens.all? { |t| t.match?(/\A\d+\z/) }
          raise ConnectionError, "unexpected reply to LOCK: #{rest}"
        end

        tokens.map { |t| Integer(t, 10) }
      rescue Error => e
        out_of_time = deadline && Lockd.now >= deadline
        raise if !Lockd.retryable?(e) || out_of_time || (@addrs.size < 2 && !deadline) || tries > 4 * @addrs.size

        # This front-end can't serve it now (UNAVAILABLE, SHUTDOWN): the next one may.
        @monitor.synchronize { drop(true) } if e.is_a?(ServerError)

        sleep(0.05 * tries)
        retry
      end
    end

    def unlock(name, token)
      request("UNLOCK #{Lockd.word('name', name)} #{Integer(token)}")
      nil
    end

    # RENEW: the seconds the lease has left; Lockd::NotHeld if it is gone (stop: it is lost).
    def renew(name, token, ttl: nil)
      line = "RENEW #{Lockd.word('name', name)} #{Integer(token)}"
      line += " ttl=#{Lockd.ms(ttl)}" if ttl
      left(request(line))
    end

    def check(name, token)
      left(request("CHECK #{Lockd.word('name', name)} #{Integer(token)}"))
    end

    # STATUS <name>: a Status (+free+ true, or the first holder, waiters, holders and mode).
    def status(name)
      parse_status(request("STATUS #{Lockd.word('name', name)}"))
    end

    # STATUS: every held lock this user may read, sorted by name.
    def status_all
      held = []
      request("STATUS") do |line|
        while line.start_with?("INFO ")
          held << parse_status(line[5..])
          line = read_line(@timeout)
        end
        line
      end
      held
    end

    # STATUS <name> detail: holders in grant order, waiters in queue order; each one's +and+
    # names the other names of its set ([] for one name).
    def detail(name)
      holders = []
      waiters = []
      rest = request("STATUS #{Lockd.word('name', name)} detail") do |line|
        loop do
          w = line.split
          case w[0]
          when "HOLDER"
            f = fields(w[2..])
            holders << Holder.new(name: w[1], id: f["id"], token: f["token"].to_i, held_ms: f["held_ms"].to_i,
                                  ttl_ms: f["ttl_ms"].to_i, session: f["session"] == "1", mode: f["mode"], user: f["user"],
                                  note: Lockd.decode_note(f["note"]), and: ands(w[2..]))
          when "WAITER"
            f = fields(w[3..])
            waiters << Waiter.new(name: w[1], position: w[2].to_i, id: f["id"], waited_ms: f["waited_ms"].to_i,
                                  session: f["session"] == "1", mode: f["mode"], and: ands(w[3..]))
          else break
          end
          line = read_line(@timeout)
        end
        line
      end
      Detail.new(status: parse_status(rest), holders: holders, waiters: waiters)
    end

    # WATCH on a connection of its own: a Watch (#next, #each), or with a block, yields each
    # Event until the block breaks. An ERR (LAGGED, SHUTDOWN, a right taken away) ends the
    # watch: raised.
    def watch(name = nil, &block)
      c = dup
      c.request(name ? "WATCH #{Lockd.word('name', name)}" : "WATCH")
      w = Watch.new(c)
      return w unless block

      w.each(&block)
    end

    # The stream of events of one WATCH.
    class Watch
      include Enumerable

      def initialize(client)
        @client = client
      end

      # The next Event, waiting at most +timeout+ seconds (nil: as long as it takes).
      def next(timeout = nil)
        @client.next_event(timeout)
      end

      def each
        loop { yield self.next }
      ensure
        close
      end

      def close
        @client.close
      end
    end

    # The next event of a watch on this connection, within +limit+ seconds (nil: no bound).
    def next_event(limit)
      @monitor.synchronize do
        loop do
          raise ConnectionError, "the watch has ended" unless @sock

          line = read_line(limit)
          if line.start_with?("ERR ")
            drop(true)
            code, detail = line[4..].split(" ", 2)
            raise Lockd.server_error(code, detail)
          end
          w = line.split(" ")
          next unless w.size >= 6 && w[0] == "EVENT"

          # Fields after the fixed words are read by key (a newer lockd may add more).
          extra = w[6..].filter_map { |f| f.split("=", 2) if f.include?("=") }.to_h
          return Event.new(kind: w[1], name: w[2], id: w[3], token: w[4].to_i, unix_ms: w[5].to_i,
                           note: Lockd.decode_note(extra["note"]), by: extra["by"])
        end
      end
    end

    # Runs the block with the fencing token, holding the lock and renewing the lease in the
    # background; releases it when the block ends, even by an exception. The lease is a
    # session lease with a grace (+grace+, at most the ttl) on a connection of its own;
    # renewals go every third of the time the lease surely lives without one. When the lease
    # can no longer be trusted (a renewal refused, or none got through before that time, less
    # a margin), Lockd::LeaseLost is raised in the block's thread at once, before lockd can
    # grant the lock to anyone else (and again after the block, if the block rescued it).
    # +note+ and +supersede+ are LOCK's (#lock); a superseded wait raises Lockd::Superseded.
    def with_lock(name, ttl: DEFAULT_TTL, grace: DEFAULT_GRACE, wait: nil, shared: false, limit: nil,
                  supersede: false, note: nil)
      grace = [grace, ttl].min
      hold = grace.positive? ? grace : ttl
      margin = [hold / 10.0, 0.05].max
      rc = dup
      Thread.handle_interrupt(LeaseLost => :never) do
        token = rc.lock(name, ttl: ttl, wait: wait, session: true, grace: grace, shared: shared, limit: limit,
                           supersede: supersede, note: note)
        sent = Lockd.now # a renewal at once: a LOCK that waited does not say when its lease began
        rc.renew(name, token)
        keeper = Keeper.new(rc, name, token, hold, margin, sent, Thread.current)
        begin
          result = Thread.handle_interrupt(LeaseLost => :immediate) { yield token }
        ensure
          keeper.stop
          unless keeper.lost
            2.times do
              rc.unlock(name, token)
              break
            rescue ConnectionError
              next
            rescue Error
              break
            end
          end
          rc.close
        end
        raise keeper.lost if keeper.lost

        result
      end
    end

    # Renews one lease in a thread of its own; raises LeaseLost in +owner+ when it is lost.
    class Keeper
      attr_reader :lost

      def initialize(client, name, token, hold, margin, last, owner)
        @client, @name, @token, @hold, @margin, @last, @owner = client, name, token, hold, margin, last, owner
        @mutex = Mutex.new
        @cv = ConditionVariable.new
        @stopped = false
        @lost = nil
        @thread = Thread.new { run }
      end

      def stop
        @mutex.synchronize do
          @stopped = true
          @cv.signal
        end
        @thread.join
      end

      private

      def pause(seconds)
        @mutex.synchronize do
          @cv.wait(@mutex, seconds) if !@stopped && seconds.positive?
          @stopped
        end
      end

      def mark_lost(why)
        @mutex.synchronize do
          return if @stopped

          @lost = LeaseLost.new(@name, @token, why)
          @owner.raise(@lost)
        end
      end

      def run
        loop do
          give_up = @last + @hold - @margin
          return if pause(@last + @hold / 3.0 - Lockd.now)

          loop do
            return mark_lost(format("no renewal got through within %.3fs", @hold - @margin)) if Lockd.now >= give_up

            sent = Lockd.now
            begin
              @client.renew_within(@name, @token, give_up - sent)
              @last = sent
              break
            rescue Error => e
              return mark_lost(e.message) unless Lockd.retryable?(e)
              return if pause(0.05)
            end
          end
        end
      end
    end

    # RENEW whose reply may take at most +limit+ seconds (the keeper's deadline).
    def renew_within(name, token, limit)
      left(request("RENEW #{name} #{token}", limit: [limit, 0.001].max))
    end

    protected

    # Sends +line+ and returns the text after OK, or raises the ERR's ServerError; a block
    # reads the rest of a many-line answer from the first line.
    def request(line, limit: @timeout)
      @monitor.synchronize do
        dial unless @sock
        begin
          write(line)
          reply = read_line(limit)
          reply = yield(reply) if block_given?
        rescue Error, SystemCallError, IOError, OpenSSL::SSL::SSLError => e
          drop(true) # a reply may still come: it must not answer a later request
          raise e.is_a?(Error) ? e : ConnectionError.new("#{@addrs[@at][0]}: #{e.message}")
        end
        return reply[3..] || "" if reply == "OK" || reply.start_with?("OK ")
        raise(drop(true) || ConnectionError.new("unexpected reply #{reply.inspect}")) unless reply.start_with?("ERR ")

        code, detail = reply[4..].split(" ", 2)
        drop(true) if %w[TOOLONG LAGGED SHUTDOWN TLS].include?(code)
        raise Lockd.server_error(code, detail)
      end
    end

    private

    def tls_context(tls, ca, cert, key)
      unless tls == false
        ca ||= ENV["LOCKD_TLS_CA"]
        cert ||= ENV["LOCKD_CLIENT_CERT"]
        key ||= ENV["LOCKD_CLIENT_KEY"]
      end
      return nil unless tls || ca || cert

      # One context per kind of host: OpenSSL checks a name itself, an IP address is checked
      # after the handshake (post_connection_check), as SNI can't carry one.
      { name: ssl_context(ca, cert, key, true), ip: ssl_context(ca, cert, key, false) }
    end

    def ssl_context(ca, cert, key, verify_hostname)
      ctx = OpenSSL::SSL::SSLContext.new
      ctx.min_version = OpenSSL::SSL::TLS1_2_VERSION
      ctx.verify_mode = OpenSSL::SSL::VERIFY_PEER
      ctx.verify_hostname = verify_hostname
      store = OpenSSL::X509::Store.new
      ca ? store.add_file(ca) : store.set_default_paths
      ctx.cert_store = store
      if cert
        ctx.cert = OpenSSL::X509::Certificate.new(File.read(cert))
        ctx.key = OpenSSL::PKey.read(File.read(key || cert))
      end
      ctx
    end

    def credentials(user, secret, file)
      user ||= ENV["LOCKD_USER"]
      if secret.nil? && file.nil?
        secret = ENV["LOCKD_SECRET"]
        file = ENV["LOCKD_SECRET_FILE"]
      end
      raise ArgumentError, "the secret is given twice: give it one way" if secret && file

      secret = File.open(file, &:gets).to_s.chomp if file
      raise ArgumentError, "user #{user} needs a secret" if user && secret.to_s.empty?
      raise ArgumentError, "a secret without a user" if secret && !user

      @user = user && Lockd.word("user", user)
      @secret = secret && Lockd.word("secret", secret)
    end

    def drop(failed)
      if @sock
        @sock.close rescue nil # rubocop:disable Style/RescueModifier
        @start = @at + 1 if failed
      end
      @sock = nil
      @buf = +""
      nil
    end

    def dial
      failed = []
      @addrs.size.times do |k|
        i = (@start + k) % @addrs.size
        text, host, port = @addrs[i]
        begin
          sock = Socket.tcp(host, port, connect_timeout: @timeout)
          sock.setsockopt(Socket::IPPROTO_TCP, Socket::TCP_NODELAY, 1)
          sock = secure(sock, host, text) if @tls
        rescue SystemCallError, IOError, SocketError => e
          failed << "#{text} (#{e.message})"
          next
        end
        @sock = sock
        @buf = +""
        @at = @start = i
        login(text) if @user
        return
      end
      raise ConnectionError, "cannot connect to lockd at #{failed.join('; nor at ')}"
    end

    def secure(sock, host, text)
      ip = host.match?(/\A[\d.]+\z|:/)
      ssl = OpenSSL::SSL::SSLSocket.new(sock, @tls[ip ? :ip : :name])
      ssl.hostname = host unless ip
      ssl.sync_close = true
      ssl.connect_nonblock(exception: false).then do |r|
        until r == ssl
          IO.select(r == :wait_readable ? [ssl] : nil, r == :wait_writable ? [ssl] : nil, nil, @timeout) or
            raise ConnectionError.new("no TLS handshake from lockd at #{text}", final: true)
          r = ssl.connect_nonblock(exception: false)
        end
      end
      ssl.post_connection_check(host) if ip
      ssl
    rescue OpenSSL::SSL::SSLError => e
      sock.close
      # A TLS failure is the configuration's: every front-end would refuse it alike.
      raise ConnectionError.new("TLS with lockd at #{text} failed: #{e.message}", final: true)
    end

    def login(text)
      write("AUTH #{@user} #{@secret}")
      reply = read_line(@timeout)
      return if reply.start_with?("OK") || reply.start_with?("ERR DENIED authentication is off") ||
                reply.start_with?("ERR DENIED already authenticated as #{@user};")

      drop(false)
      code, detail = reply.sub(/\AERR /, "").split(" ", 2)
      raise Lockd.server_error(code, "lockd at #{text} refused to log in user #{@user}: #{detail}")
    rescue SystemCallError, IOError => e
      drop(true)
      raise ConnectionError, "#{text}: #{e.message}"
    end

    def write(line)
      @sock.write("#{line}\n")
    end

    # One reply line within +limit+ seconds (nil: no bound).
    def read_line(limit)
      deadline = limit && Lockd.now + limit
      loop do
        if (i = @buf.index("\n"))
          line = @buf.slice!(0, i + 1)
          return line.chomp.force_encoding(::Encoding::UTF_8)
        end
        raise ConnectionError, "over-long reply line" if @buf.bytesize > MAX_REPLY

        chunk = @sock.read_nonblock(4096, exception: false)
        case chunk
        when :wait_readable, :wait_writable
          left = deadline && deadline - Lockd.now
          raise ConnectionError, "no reply from lockd at #{@addrs[@at][0]} in time" if left && left <= 0

          IO.select([@sock], nil, nil, left)
        when nil then raise ConnectionError, "lockd at #{@addrs[@at][0]} closed the connection"
        else @buf << chunk.b
        end
      end
    end

    def fields(words)
      words.each_with_object({}) do |w, f|
        k, v = w.split("=", 2)
        f[k] = v if v
      end
    end

    # The and= fields of a detail line (a set's other names; the one key that repeats), in order.
    def ands(words)
      words.filter_map { |w| w.delete_prefix("and=") if w.start_with?("and=") }
    end

    def left(rest)
      raise ConnectionError, "unexpected reply #{rest}" unless rest.start_with?("ttl_ms=")

      rest[7..].to_i / 1000.0
    end

    # "<name> free ..." or "<name> held id=..": a free lock is told by the word after its name.
    def parse_status(text)
      w = text.split
      return Status.new(name: w[0], free: true) if w[1] == "free"
      raise ConnectionError, "unexpected STATUS line #{text}" unless w[1] == "held"

      f = fields(w[2..])
      Status.new(name: w[0], free: false, id: f["id"], token: f["token"].to_i, ttl_ms: f["ttl_ms"].to_i,
                 session: f["session"] == "1", waiters: f["waiters"].to_i,
                 holders: f["mode"] ? f["holders"].to_i : 1, mode: f["mode"] || "exclusive",
                 note: Lockd.decode_note(f["note"]))
    end
  end
end
