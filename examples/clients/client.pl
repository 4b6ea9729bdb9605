#!/usr/bin/perl
# A raw-socket AgentOS client in Perl, with nothing but its core modules:
# HELLO, NOOP, THINK and LIST over the 17-byte-header protocol.
#
#     perl examples/clients/client.pl [SOCKET]
use strict;
use warnings;
use IO::Socket::UNIX;

my $MAGIC = 0x41474E54;
my $path = $ARGV[0] // $ENV{AGENTOS_SOCKET} // '/run/agentos/agentos.sock';
my $socket = IO::Socket::UNIX->new(Type => SOCK_STREAM(), Peer => $path)
    or die "cannot talk to the kernel at $path: $!\n";

sub read_exactly {
    my ($length) = @_;
    my $data = '';
    while (length($data) < $length) {
        my $read = sysread($socket, my $chunk, $length - length($data));
        die "the kernel closed the connection\n" unless $read;
        $data .= $chunk;
    }
    return $data;
}

sub call {
    my ($opcode, $payload) = @_;
    # magic, agent_id (u32 LE), opcode (u8), payload length (u64 LE)
    syswrite($socket, pack('V V C Q<', $MAGIC, 0, $opcode, length($payload)) . $payload);
    my ($magic, $agent, $op, $length) = unpack('V V C Q<', read_exactly(17));
    die "bad magic in a reply\n" unless $magic == $MAGIC;
    return read_exactly($length);
}

print 'hello ', call(0xFE, ''), "\n";
print 'noop ', call(0x00, 'ping'), "\n";
print 'think ', call(0x01, 'What is 2+2?'), "\n";
print 'list ', call(0x12, ''), "\n";
