# frozen_string_literal: true

# The LOCK of a set of names (and:) against a fake server on 127.0.0.1 that grants every LOCK
# with one token per name and keeps the lines it got: the words sent (and=<name> per further
# name, before the note), the tokens read back, and the and= fields of STATUS <name> detail.
# No lockd needed. (The set's grant by a real lockd is the conformance scenarios'.)
require "minitest/autorun"
require "socket"
require "lockd"

class SetsTest < Minitest::Test
  DETAIL = "HOLDER db-migrate id=ci-7 token=40 held_ms=5 ttl_ms=9 session=0 mode=exclusive " \
           "granted=1700000000000 and=cache-flush note=two%20names\n" \
           "WAITER db-migrate 1 id=ci-8 waited_ms=3 session=0 mode=shared and=cache-flush and=queue\n" \
           "WAITER db-migrate 2 id=ci-9 waited_ms=1 session=0 mode=exclusive\n" \
           "OK db-migrate held id=ci-7 token=40 ttl_ms=9 session=0 waiters=2 note=two%20names\n"

  # A LOCK gets OK and one token per name (+short+: one fewer); STATUS the lines above.
  def fake(short: false)
    server = TCPServer.new("127.0.0.1", 0)
    lines = Queue.new
    Thread.new do
      loop do
        conn = server.accept
        Thread.new do
          conn.each_line do |line|
            line = line.chomp
            lines << line
            conn.write(
              if line.start_with?("LOCK ")
                names = 1 + line.split(" note=", 2)[0].split.count { |w| w.start_with?("and=") }
                "OK #{Array.new(names - (short ? 1 : 0)) { |i| 40 + i }.join(' ')}\n"
              elsif line.start_with?("STATUS ") then DETAIL
              else "OK PONG\n"
              end
            )
          end
        rescue IOError, SystemCallError
          nil
        end
      end
    rescue IOError, SystemCallError
      nil
    end
    @servers << server
    [Lockd::Client.new(addrs: "127.0.0.1:#{server.addr[1]}", id: "ci-7", timeout: 5.0, tls: false), lines]
  end

  def setup
    @servers = []
  end

  def teardown
    @servers.each(&:close)
  end

  def locks(lines)
    all = []
    all << lines.pop until lines.empty?
    all.select { |l| l.start_with?("LOCK ") }
  end

  def test_a_set_sends_and_words_and_returns_a_token_per_name
    c, lines = fake
    assert_equal [40, 41, 42], c.lock_tokens("db-migrate", ttl: 600, and: %w[cache-flush queue], note: "two names")
    line = locks(lines).last
    assert line.start_with?("LOCK db-migrate ci-7 ttl=600000ms"), line
    assert line.end_with?(" and=cache-flush and=queue note=two names"), line
    # #lock returns the first name's token; of one name, its token alone.
    assert_equal 40, c.lock("db-migrate", and: ["cache-flush"])
    assert_equal [40], c.lock_tokens("db-migrate")
    refute_includes locks(lines).last, "and="
    c.close
  end

  def test_a_reply_without_a_token_per_name_is_a_connection_error
    c, = fake(short: true)
    assert_raises(Lockd::ConnectionError) { c.lock_tokens("a", and: %w[b c]) }
    c.close
  end

  def test_a_set_is_checked_before_it_is_sent
    c, lines = fake
    assert_raises(ArgumentError) { c.lock("a", and: ["b c"]) }
    assert_raises(ArgumentError) { c.lock("a", and: "b") }
    assert_raises(ArgumentError) { c.lock("a", and: ["b"], supersede: true) }
    assert_empty locks(lines)
    c.close
  end

  def test_detail_names_a_sets_other_names_in_and
    c, = fake
    d = c.detail("db-migrate")
    assert_equal [[["cache-flush"], "two names"]], d.holders.map { |h| [h.and, h.note] }
    assert_equal [%w[cache-flush queue], []], d.waiters.map(&:and)
    c.close
  end
end
